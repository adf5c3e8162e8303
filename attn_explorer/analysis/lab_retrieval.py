"""Retrieval heads (Wu et al. 2024) by needle in a haystack.

`make_haystack` puts a needle sentence at a depth (0: first, 1: last) of filler text cut to a token length,
then a question. `retrieval_scores` lets the model answer greedily, one token a step through its KV cache:
the prompt (but its last token) runs once with no maps, then each step runs one token and keeps only that
query's attention row (L, H, n), never a full map. At each step whose generated token w also appears in the
needle, a head whose most-attended key is a copy of w inside the needle gets a hit. A head's retrieval
score = its hits / the answer tokens copied from the needle (over every case). A case is answered when the
generated text contains the needle's key fact (case-insensitive). `retrieval_ablation` checks the score:
the top heads off lower needle accuracy more than as many random heads (analysis.lab.AblationCheck).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from attn_explorer.analysis.lab import AblationCheck, check_scores, random_head_sets, ranked_heads
from attn_explorer.errors import UserError

if TYPE_CHECKING:
    from attn_explorer.api.model import Model

NEEDLE = "The special magic number for the blue lighthouse is 7384."
QUESTION = "\n\nQuestion: What is the special magic number for the blue lighthouse?\nAnswer: The special magic number for the blue lighthouse is"
KEY_FACT = "7384"
FILLER_CHARS = 400_000  # of the bundled corpus: about 100,000 tokens of filler


@dataclass
class Haystack:
    """One prompt: filler with the needle at `depth`, then the question; token ids as the model reads them."""

    ids: list[int]
    needle: tuple[int, int]  # [start, end) token span of the needle in ids
    answer: str  # the key fact the generated answer must contain
    length: int  # the length asked for (tokens)
    depth: float

    @property
    def needle_ids(self) -> list[int]:
        return self.ids[self.needle[0]:self.needle[1]]

    @property
    def tokens(self) -> int:
        """The tokens the model reads: a few under `length`, since the filler is cut to fit."""
        return len(self.ids)


def bundled_filler(chars: int = FILLER_CHARS) -> str:
    """The bundled corpus (resources/corpus, its plays in name order) joined, cut to `chars` characters."""
    from attn_explorer.resources import resource_path

    out, n = [], 0
    for p in sorted(resource_path("corpus").glob("*.txt")):
        text = p.read_text(encoding="utf-8")
        out.append(text)
        n += len(text)
        if n >= chars:
            break
    if not out:
        raise UserError("the bundled corpus is missing (resources/corpus); give filler text")
    return "\n\n".join(out)[:chars]


def _cut_at_sentence(text: str, at: int) -> int:
    """The character index at or before `at` just after a sentence or line end (at itself when none is near)."""
    if at <= 0 or at >= len(text):
        return max(0, min(at, len(text)))
    best = max(text.rfind(". ", 0, at), text.rfind("\n", 0, at))
    return best + 1 if best >= 0 and at - best < 400 else at


def make_haystack(needle: str, question: str, filler_text: str, length_tokens: int, depth: float, tokenizer,
                  answer: str = KEY_FACT) -> Haystack:
    """The prompt filler[:a] + needle + filler[a:b] + question, about length_tokens tokens in all (the filler
    is cut to fit), the needle after the fraction `depth` of the filler (moved back to a sentence end).
    tokenizer: the model's (api tokenizer with .tok, a tokenizers.Tokenizer)."""
    tok = getattr(tokenizer, "tok", tokenizer)
    try:
        depth = float(depth)
    except (TypeError, ValueError):
        raise UserError(f"depth must be a number from 0 to 1, got {depth!r}") from None
    if not 0.0 <= depth <= 1.0:
        raise UserError(f"depth must be from 0 to 1, got {depth!r}")
    length = int(length_tokens)
    fixed = len(tok.encode(needle + " " + question).ids) + 2
    room = length - fixed
    if room < 1:
        raise UserError(f"a haystack of {length} tokens has no room for filler: the needle and question take {fixed}")
    enc = tok.encode(filler_text, add_special_tokens=False)
    if len(enc.ids) < room:
        raise UserError(f"the filler has {len(enc.ids):,} tokens; {room:,} are needed for {length:,}")
    end = enc.offsets[room - 1][1]
    filler = filler_text[:end]
    at = _cut_at_sentence(filler, int(round(depth * len(filler))))
    head, tail = filler[:at].rstrip(" "), filler[at:].lstrip(" ")
    sep = "" if question[:1].isspace() else " "
    prompt = (head + " " if head else "") + needle + (" " + tail if tail else "") + sep + question
    start = len(head) + 1 if head else 0
    stop = start + len(needle)
    full = tok.encode(prompt)
    special = full.special_tokens_mask
    inside = [i for i, (a, b) in enumerate(full.offsets) if not special[i] and b > start and a < stop]
    if not inside:
        raise UserError("the needle has no tokens in the prompt")
    return Haystack(list(full.ids), (inside[0], inside[-1] + 1), answer, length, depth)


@dataclass
class Answered:
    """One case's greedy answer and the heads' hits."""

    new_ids: list[int]
    text: str
    correct: bool
    copied: int  # generated tokens that appear in the needle
    hits: np.ndarray  # (L, H) int: steps whose copied token the head attended to most, inside the needle


def answer(model: Model, case: Haystack, max_new_tokens: int, ablate: dict | None = None) -> Answered:
    """Greedy answer to one haystack through the KV cache (module docstring), heads of ablate switched off."""
    import torch

    from attn_explorer.api.hooks import ablation_hooks
    from attn_explorer.core.hooks import Hooks

    info, module = model.info, model.module
    if len(case.ids) + max_new_tokens > info.max_positions:
        raise UserError(f"{len(case.ids)} prompt tokens + {max_new_tokens} new ones exceed {info.name}'s "
                        f"{info.max_positions} positions")
    fns = ablation_hooks(ablate, info) if ablate else {}
    hooks = Hooks({k: (v,) for k, v in fns.items()}) if fns else None
    tok = model.tokenizer
    stops = {i for i, t in tok.tok.get_added_tokens_decoder().items() if t.special}
    a, b = case.needle
    needle = torch.tensor(case.needle_ids)
    hits = np.zeros((info.num_layers, info.num_heads), dtype=np.int64)
    copied, new = 0, []
    cache = module.new_cache()
    dev = model.device
    with torch.inference_mode():
        if len(case.ids) > 1:
            module(input_ids=torch.tensor([case.ids[:-1]], device=dev), cache=cache, hooks=hooks)
        feed = case.ids[-1:]
        for _ in range(int(max_new_tokens)):
            out = module(input_ids=torch.tensor([feed], device=dev), output_attentions=True, cache=cache,
                         hooks=hooks)
            logits = module.logits(out.hidden[:, -1:])[0, -1]
            w = int(logits.float().argmax())
            new.append(w)
            if bool((needle == w).any()):
                copied += 1
                top = out.attentions[0, :, :, -1, :].float().argmax(-1).cpu()  # (L, H) most-attended key
                in_needle = (top >= a) & (top < b)
                same = torch.tensor(case.ids)[top.clamp(max=len(case.ids) - 1)] == w  # that token, there
                hits += (in_needle & same).numpy().astype(np.int64)
            if w in stops:
                break
            feed = [w]
    text = tok.tok.decode(new, skip_special_tokens=True)
    return Answered(new, text, case.answer.lower() in text.lower(), copied, hits)


@dataclass
class RetrievalResult:
    """Every case's answer; scores (L, H) = hits / copied tokens over all cases (0 where none was copied).
    `actual` (lengths, depths): the prompt tokens the model read for each asked length and depth (the mean
    where a cell holds several cases; -1 where none)."""

    model: str
    lengths: list[int]
    depths: list[float]
    accuracy: np.ndarray  # (lengths, depths) share of cases answered
    scores: np.ndarray  # (L, H)
    copied: int
    answers: list[tuple[int, float, str, bool]]  # (length, depth, generated text, correct)
    actual: np.ndarray | None = None  # (lengths, depths) int: tokens read; None: not recorded (an old file)

    def ranked(self) -> list[tuple[int, int, float]]:
        return [(l, h, float(self.scores[l, h])) for l, h in ranked_heads(self.scores)]

    def arrays(self) -> dict[str, np.ndarray]:
        r = self.ranked()
        return {"accuracy": self.accuracy, "retrieval": self.scores, "lengths": np.array(self.lengths),
                "depths": np.array(self.depths, dtype=np.float64), "copied": np.array(self.copied),
                **({"actual_tokens": np.asarray(self.actual, dtype=np.int64)} if self.actual is not None else {}),
                "heads_ranked": np.array([(l, h) for l, h, _ in r], dtype=np.int64).reshape(-1, 2),
                "answers": np.array([t for *_, t, _ in self.answers], dtype=str),
                "answer_lengths": np.array([n for n, *_ in self.answers], dtype=np.int64),
                "answer_depths": np.array([d for _, d, *_ in self.answers], dtype=np.float64),
                "correct": np.array([c for *_, c in self.answers], dtype=bool), "model": np.array(self.model),
                "method": np.array("hits / answer tokens copied from the needle; a hit: the head's most-attended "
                                   "key is that token inside the needle (Wu et al. 2024); greedy answers")}


def check_decoder(model: Model) -> None:
    from attn_explorer.analysis.atlas_build import check_model

    check_model(model)
    if not getattr(model.module, "causal", False) or not hasattr(model.module, "logits"):
        raise UserError(f"{model.info.name} is not a decoder with a language-model head: the retrieval lab "
                        "lets it answer")


def retrieval_scores(model: Model, cases: list[Haystack], max_new_tokens: int = 8, ablate: dict | None = None,
                     progress: Callable[[int, int], None] | None = None) -> RetrievalResult:
    """Answer every case (see `answer`); accuracy per (length, depth) and every head's retrieval score."""
    check_decoder(model)
    if not cases:
        raise UserError("no haystacks to answer")
    lengths = sorted({c.length for c in cases})
    depths = sorted({c.depth for c in cases})
    right = np.zeros((len(lengths), len(depths)))
    count = np.zeros_like(right)
    hits = np.zeros((model.info.num_layers, model.info.num_heads))
    read = np.zeros_like(right)
    copied, answers = 0, []
    for i, c in enumerate(cases):
        got = answer(model, c, max_new_tokens, ablate)
        li, di = lengths.index(c.length), depths.index(c.depth)
        right[li, di] += got.correct
        count[li, di] += 1
        read[li, di] += c.tokens
        hits += got.hits
        copied += got.copied
        answers.append((c.length, c.depth, got.text, got.correct))
        if progress is not None:
            progress(i + 1, len(cases))
    acc = np.where(count > 0, right / np.maximum(count, 1), np.nan)
    actual = np.where(count > 0, np.rint(read / np.maximum(count, 1)), -1).astype(np.int64)
    return RetrievalResult(model.info.name, lengths, depths, acc, hits / max(copied, 1), copied, answers, actual)


def needle_accuracy(model: Model, cases: list[Haystack], max_new_tokens: int, ablate: dict | None = None) -> float:
    return float(np.mean([answer(model, c, max_new_tokens, ablate).correct for c in cases]))


def retrieval_ablation(model: Model, cases: list[Haystack], scores, top: int = 5, random_sets: int = 5,
                       seed: int = 0, max_new_tokens: int = 8,
                       progress: Callable[[int, int], None] | None = None) -> AblationCheck:
    """Needle accuracy with the top retrieval heads off against as many random heads (of the others) off."""
    check_decoder(model)
    s = check_scores(model, scores, "retrieval scores")
    k, sets = int(top), int(random_sets)
    if k < 1 or sets < 1:
        raise UserError(f"top and random_sets must be at least 1, got {top} and {random_sets}")
    ranked = ranked_heads(s)
    top_heads = ranked[:k]
    randoms = random_head_sets(ranked, top_heads, k, sets, seed)
    total = 2 + sets
    clean = needle_accuracy(model, cases, max_new_tokens)
    if progress is not None:
        progress(1, total)
    top_acc = needle_accuracy(model, cases, max_new_tokens, {h: "zero" for h in top_heads})
    if progress is not None:
        progress(2, total)
    rand = []
    for i, heads in enumerate(randoms):
        rand.append(needle_accuracy(model, cases, max_new_tokens, {h: "zero" for h in heads}))
        if progress is not None:
            progress(3 + i, total)
    return AblationCheck(model.info.name, "needle accuracy", clean, top_heads, top_acc, randoms, rand,
                         higher_is_worse=False)
