"""The Generate page's session object: one generation at a time on the session's model, streamed step
by step as a generator job in the session's "generate" lane (`state.submit(key="generate", on_yield=...)`);
Stop is `state.cancel("generate")`, which drops every step still on its way.

It keeps what the page draws, already reduced to NumPy arrays: each step's attention row, the
next-token probabilities, and the share of attention on the first token (the "attention sink"),
averaged over every layer and head. A new model or a new generation clears it all at once; asking for
another model stops a generation in flight (its steps would come from the old model), and the clearing
then says what happened (`cleared`'s note).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Signal

from attn_explorer.session.prompt_info import PromptInfo

SUGGESTED_MODEL = "smollm2-135m"
LANE = "generate"


def generation_job(model: Any, prompt: str, max_new_tokens: int, temperature: float, top_k: int | None,
                   chat: bool, seed: int | None):
    """Runs in a worker: yields a PromptInfo, then every api.generate.Step. Returns the step count."""
    from attn_explorer.session.jobs import configure_torch

    configure_torch()
    gen = model.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, chat=chat,
                         seed=seed)
    yield PromptInfo(gen.prompt_text, list(gen.prompt_tokens), list(gen.prompt_ids))
    count = 0
    for step in gen:
        count += 1
        yield step
    return count


def has_chat_template(model: Any) -> bool:
    """True when the model's tokenizer has a chat template (an instruct model); reads a string, runs no torch."""
    tok = getattr(model, "tokenizer", None)
    return bool(getattr(tok, "chat_template", None))


class GenerationSession(QObject):
    """State of the Generate page. Signals are past tense; every handler runs in the GUI thread."""

    started = Signal()  # a generation began: everything shown before is cleared
    prompt_ready = Signal(object)  # PromptInfo
    step_arrived = Signal(object)  # api.generate.Step
    finished = Signal(str)  # "done", "stopped", "stopped: <why>" or "failed: <one line>"
    cleared = Signal(str)  # the model changed: nothing generated is valid any more; a note ("" or what stopped)
    chat_known = Signal(bool)  # whether the loaded model has a chat template (an instruct model)

    def __init__(self, state: Any, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self._running = False
        self._interrupted: tuple[str, int] | None = None  # (old model, tokens) of a generation a load stopped
        self.prompt: PromptInfo | None = None
        self.steps: list = []
        self.sink: list[float] = []  # per step: mean over layers and heads of the weight on token 0
        self.temperature = 0.0  # of the generation shown (the slider may have moved since)
        self.chat = False  # the generation shown wrapped its prompt in the chat template
        self.max_new_tokens = 0  # of the generation shown
        self.has_chat: bool | None = None  # the loaded model has a chat template (None: not known yet)
        state.model_loading.connect(self._model_loading)
        state.model_loaded.connect(lambda _info: self.clear())
        state.model_loaded.connect(lambda _info: self._ask_chat())
        state.inputs.input_changed.connect(self._input_changed)
        if state.has_model:
            self._ask_chat()

    # ------------------------------------------------------------------ what the page asks
    @property
    def info(self):
        return self.state.info

    @property
    def can_generate(self) -> bool:
        """The open model writes text one token at a time (a decoder)."""
        i = self.state.info
        return i is not None and i.modality in ("text", "image-text") and bool(i.causal) and self.state.has_model

    @property
    def is_vlm(self) -> bool:
        """The open model reads a picture and a prompt (issue 26 B): it writes after the session's picture,
        greedily, and each step's row is drawn on the picture (session.vlm_generation)."""
        i = self.state.info
        return i is not None and i.modality == "image-text"

    @property
    def running(self) -> bool:
        return self._running

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.steps)

    def newest_rows(self) -> np.ndarray | None:
        """(L·H, n): the newest token's attention row in every head (layer-major), over every token so far;
        one column more with each new token."""
        if not self.steps:
            return None
        a = self.steps[-1].attention
        return a.reshape(a.shape[0] * a.shape[1], a.shape[2])

    def head_rows(self, layer: int, head: int) -> np.ndarray | None:
        """(steps, n): one head's row of every step, padded with NaN on the right (a growing triangle)."""
        if not self.steps:
            return None
        n = self.steps[-1].attention.shape[-1]
        out = np.full((len(self.steps), n), np.nan, dtype=np.float32)
        for i, s in enumerate(self.steps):
            row = s.attention[layer, head]
            out[i, : row.shape[0]] = row
        return out

    def ended_at_once(self) -> bool:
        """The generation shown ended on an end token before writing anything but white space (an instruct
        model asked without its chat template often does: it answers `<|im_end|>`)."""
        s = self.steps
        return (bool(s) and s[-1].last and len(s) < self.max_new_tokens
                and "".join(x.text for x in s[:-1]).strip() == "")

    def _ask_chat(self) -> None:
        """Read the tokenizer's chat template (a string attribute: no torch runs), and say whether there is one."""
        self.has_chat = has_chat_template(self.state._model) if self.can_generate and not self.is_vlm else False
        self.chat_known.emit(self.has_chat)

    # ------------------------------------------------------------------ intent
    def start(self, prompt: str, chat: bool = False, temperature: float = 0.0, max_new_tokens: int = 32,
              top_k: int | None = None, seed: int | None = None) -> bool:
        """Begin a new generation (stopping one in flight). False when there is no decoder to run."""
        if not self.can_generate:
            return False
        self.stop(report=False)  # the old stream ends at its next step instead of running on unseen
        self._reset()
        self._interrupted = None
        job, args = generation_job, (prompt, max_new_tokens, temperature, top_k, chat, seed)
        if self.is_vlm:  # the picture open in the session, and the prompt (greedy: temperature and chat unused)
            from attn_explorer.session.vlm_generation import vlm_generation_job

            job, args = vlm_generation_job, (self.state.image, prompt, max_new_tokens)
            temperature, chat = 0.0, False
        self.temperature = float(temperature)
        self.chat, self.max_new_tokens = bool(chat), int(max_new_tokens)
        self.started.emit()
        self._running = bool(self.state.submit(job, *args,
                                               key=LANE, on_yield=self._on_yield,
                                               on_result=lambda _n: self._end("done"), on_error=self._on_error))
        return self._running

    def stop(self, report: bool = True) -> None:
        """Stop the generation in flight: steps already on their way are dropped."""
        if not self._running:
            return
        self.state.cancel(LANE)
        self._running = False
        if report:
            self.finished.emit("stopped")

    def clear(self) -> None:
        """Forget everything generated (a new model); the note says if a generation was cut short."""
        had = len(self.steps)
        self.stop(report=False)
        self._reset()
        info = self.state.info
        new = f" ({info.name})" if info is not None else ""
        note = ""
        if self._interrupted is not None:
            n = self._interrupted[1]
            note = (f"Another model{new} was loaded: the generation stopped after {n} token{'' if n == 1 else 's'}, "
                    "and what it wrote is cleared (it came from the old model).")
        elif had:
            note = f"Another model{new} was loaded: what the old model wrote is cleared."
        self._interrupted = None
        self.cleared.emit(note)

    def _input_changed(self, what: str) -> None:
        """A vision-language model writes after the session's picture: a new one makes what was written stale."""
        if what == "image" and self.is_vlm and (self.steps or self._running):
            self.stop(report=False)
            self._reset()
            self.cleared.emit("A new picture was opened: what was written after the old one is cleared (press "
                              "Generate to write after this one).")

    def _model_loading(self, _src: str) -> None:
        """Another model was asked for: stop now (the old model's steps are no use), say so once it is in."""
        if self._running:
            self._interrupted = (self.info.name if self.info is not None else "the old model", len(self.steps))
            self.stop(report=False)
            self.finished.emit("stopped: another model was asked for")

    # ------------------------------------------------------------------ from the worker
    def _reset(self) -> None:
        self.prompt, self.steps, self.sink = None, [], []

    def _on_yield(self, item: Any) -> None:
        if isinstance(item, PromptInfo):
            self.prompt = item
            self.prompt_ready.emit(item)
            return
        self.steps.append(item)
        self.sink.append(float(item.attention[:, :, 0].mean()))
        self.step_arrived.emit(item)

    def _on_error(self, message: str) -> None:
        self._running = False
        self.state.error_raised.emit(message)
        self.finished.emit(f"failed: {message}")

    def _end(self, how: str) -> None:
        self._running = False
        self.finished.emit(how)
