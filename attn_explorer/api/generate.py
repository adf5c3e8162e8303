"""Generation with a decoder, one token at a time, with each new token's attention.

`generate(model, prompt, ...)` checks its arguments at once (one UserError line each) and returns a
`Generation`: an iterator of `Step`s. The prompt runs through the stack once; after that each step runs
only the newest token, attending to the keys and values kept in a `KVCache`. Each step carries the
chosen token, the most likely next tokens with their probabilities, and the attention row that chose
it: the last token's row in every layer and head, over every token so far.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from attn_explorer.core.hooks import Hooks
from attn_explorer.errors import UserError
from attn_explorer.validate import positive_int, visible_text

MAX_TEMPERATURE = 100.0
SHOWN = 10  # next-token probabilities reported per step when top_k is not given


@dataclass
class Step:
    """One generated token, plain data (crosses into the GUI thread)."""

    index: int  # 0 for the first new token
    token_id: int
    token: str  # the token as the views show it (byte-level marks made readable)
    text: str  # the text this token adds to the output (may be "" while a character is incomplete)
    position: int  # the token's position in the whole sequence (prompt + generated)
    top_ids: list[int]  # the most likely next tokens at this step, most likely first
    top_tokens: list[str]
    top_probs: list[float]  # their probabilities under the distribution sampled from (see `generate`)
    attention: np.ndarray  # float32 (L, H, position): the row of the query that chose this token
    ms: float  # forward pass time of this step
    last: bool = False  # an end token (special, such as <|im_end|>) or the last of max_new_tokens


def temperature_value(value) -> float:
    """A sampling temperature: 0 (greedy) up to MAX_TEMPERATURE."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise UserError(f"temperature must be a number from 0 to {MAX_TEMPERATURE:g}, got {value!r}") from None
    if not math.isfinite(t) or t < 0 or t > MAX_TEMPERATURE:
        raise UserError(f"temperature must be from 0 (greedy) to {MAX_TEMPERATURE:g}, got {value!r}")
    return t


def seed_value(value) -> int:
    """A sampling seed: a whole number from 0 to 2**63 - 1."""
    try:
        n = int(str(value).strip())
    except ValueError:
        n = -1
    if not 0 <= n < 2**63:
        raise UserError(f"seed must be a whole number from 0 to 2**63 - 1, got {value!r}")
    return n


def render_chat(template: str, prompt: str) -> str:
    """The chat template applied to one user message, with the assistant's turn opened."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    try:
        return env.from_string(template).render(messages=[{"role": "user", "content": prompt}],
                                                add_generation_prompt=True, bos_token="", eos_token="")
    except TemplateError as e:
        raise UserError(f"the model's chat template failed ({e})") from None


class Generation:
    """Iterator of `Step`s. Before the first step: the prompt as fed (`prompt_text`, `prompt_ids`,
    `prompt_tokens`); as it runs: `ids` (all tokens so far) and `text` (the generated text)."""

    def __init__(self, model, prompt: str, max_new_tokens, temperature, top_k, chat: bool, seed):
        info = model.info
        if info.modality != "text" or not getattr(model.module, "causal", False) or not hasattr(model.module, "logits"):
            raise UserError(f"{info.name} is not a decoder ({info.family} sees the whole text at once); "
                            "generation needs one such as smollm2-135m or a GPT-2 folder")
        if not getattr(model.module, "can_generate", True):
            raise UserError(f"{info.name} has no language-model head (it was saved as a bare {info.family} model, "
                            "without lm_head.weight): it shows attention, but it cannot generate text")
        if not isinstance(prompt, str):
            raise UserError(f"the prompt must be text, not {type(prompt).__name__}")
        visible_text(prompt)
        self.max_new_tokens = positive_int(max_new_tokens, "max_new_tokens")
        self.temperature = temperature_value(temperature)
        self.top_k = None if top_k is None else positive_int(top_k, "top_k")
        tok = model.tokenizer
        if tok is None:
            raise UserError(f"{info.name} has no tokenizer; it cannot read text")
        if chat:
            if not tok.chat_template:
                raise UserError(f"{info.name} has no chat template; generate without chat")
            prompt = render_chat(tok.chat_template, prompt)
        enc = tok.tok.encode(prompt, add_special_tokens=not chat)  # a chat template writes its own specials
        if not enc.ids:
            raise UserError("the prompt has no tokens")
        if len(enc.ids) + self.max_new_tokens > info.max_positions:
            raise UserError(f"{len(enc.ids)} prompt tokens + {self.max_new_tokens} new ones exceed "
                            f"{info.name}'s {info.max_positions} positions")
        self.model, self.tok = model, tok
        self.prompt_text = prompt
        self.prompt_ids = list(enc.ids)
        self.prompt_tokens = tok.display(self.prompt_ids)
        self.ids = list(self.prompt_ids)
        self.new_ids: list[int] = []
        self.text = ""
        self._emitted = ""  # the part of `text` the steps have handed out
        specials = {i for i, t in tok.tok.get_added_tokens_decoder().items() if t.special}
        self._stop_ids = specials
        # Its own generator: sampling never touches torch's global random state.
        self._rng = torch.Generator().manual_seed(seed_value(seed) if seed is not None
                                                  else int.from_bytes(os.urandom(8), "little") >> 1)
        self._steps = self._run()

    def __iter__(self):
        return self

    def __next__(self) -> Step:
        return next(self._steps)

    def close(self) -> None:
        self._steps.close()

    def distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """What is sampled from: softmax(logits / T) over the top_k most likely (all when None);
        temperature 0 (greedy) shows softmax(logits), whose largest entry is the greedy choice."""
        logits = logits.float()
        if self.temperature > 0:
            logits = logits / self.temperature
        if self.top_k is not None and self.top_k < logits.numel():
            kth = logits.topk(self.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.softmax(logits, dim=-1)

    def _choose(self, probs: torch.Tensor) -> int:
        if self.temperature == 0:
            return int(probs.argmax())
        return int(torch.multinomial(probs, 1, generator=self._rng))

    def _run(self):
        module, dev = self.model.module, self.model.device
        table = self.model.active_hooks()  # `with m.hooks({...}):` around the generation: each step runs them
        hooks = Hooks(table) if table else None
        cache = module.new_cache()
        feed = self.prompt_ids
        shown = self.top_k or SHOWN
        for index in range(self.max_new_tokens):
            with torch.inference_mode():
                t0 = time.perf_counter()
                out = module(input_ids=torch.tensor([feed], device=dev), output_attentions=True, cache=cache,
                             hooks=hooks)
                hidden = out.hidden if hooks is None else hooks("hook_final", out.hidden)
                logits = module.logits(hidden[:, -1:])  # (1, 1, vocab): hook_logits sees the newest position
                if hooks is not None:
                    logits = hooks("hook_logits", logits)
                # sampled on the CPU, with the CPU generator, whatever device the model is on
                logits = logits[0, -1].float().cpu()
                probs = self.distribution(logits)
                ms = (time.perf_counter() - t0) * 1000
                row = out.attentions[0, :, :, -1, :].float().cpu().numpy()  # (L, H, n so far)
                top = probs.topk(min(shown, probs.numel()))
                chosen = self._choose(probs)
            self.ids.append(chosen)
            self.new_ids.append(chosen)
            self.text = self.tok.tok.decode(self.new_ids, skip_special_tokens=False)
            last = chosen in self._stop_ids or index == self.max_new_tokens - 1
            # A character split over several byte tokens decodes as U+FFFD until its last byte arrives:
            # hold it back, except at the end, so the pieces joined are exactly `text`.
            stable = self.text if last else self.text.rstrip("\ufffd")
            added = stable[len(self._emitted):]
            self._emitted = stable
            top_ids = [int(i) for i in top.indices]
            yield Step(index=index, token_id=chosen, token=self.tok.display([chosen])[0],
                       text=added, position=len(self.ids) - 1, top_ids=top_ids,
                       top_tokens=self.tok.display(top_ids), top_probs=[float(p) for p in top.values],
                       attention=np.ascontiguousarray(row, dtype=np.float32), ms=ms, last=last)
            if last:
                return
            feed = [chosen]


def generate(model, prompt: str, max_new_tokens=32, temperature=0.0, top_k=None, chat: bool = False,
             seed=None) -> Generation:
    """Steps of generating up to max_new_tokens after prompt (see `Generation`). temperature 0 is greedy;
    above 0 the next token is sampled from softmax(logits / temperature), from the top_k most likely
    only when top_k is given; seed makes sampling repeatable. chat=True wraps the prompt in the model's
    chat template as one user message. Generation ends early at a special token (an end of turn)."""
    return Generation(model, prompt, max_new_tokens, temperature, top_k, chat, seed)
