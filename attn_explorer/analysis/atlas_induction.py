"""Induction heads by repeated random tokens (Olsson et al. 2022): a random token sequence R of length T, then
R again. On the repeat, an induction head at the copy of R[t] attends to R[t + 1] of the first copy: the
token after the earlier occurrence of the current one. A head's induction score is its mean weight there,
over the repeat's positions t = 0..T-2 and over `batches` random sequences. Random tokens have no meaning, so
only a head that matches "the token after the earlier copy" puts weight there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from attn_explorer.errors import UserError

if TYPE_CHECKING:
    from attn_explorer.api.model import Model


@dataclass
class InductionScores:
    model: str
    scores: np.ndarray  # (L, H) float64
    seq_len: int  # T: the random sequence's length (the input holds it twice, plus any special tokens)
    batches: int
    seed: int

    def ranked(self) -> list[tuple[int, int, float]]:
        H = self.scores.shape[1]
        order = np.argsort(-self.scores.ravel(), kind="stable")
        return [(int(i // H), int(i % H), float(self.scores.ravel()[i])) for i in order]

    def arrays(self) -> dict[str, np.ndarray]:
        return {"induction": self.scores, "model": np.array(self.model), "seq_len": np.array(self.seq_len),
                "batches": np.array(self.batches), "seed": np.array(self.seed),
                "method": np.array("mean weight from each repeated token to the token after its first copy, "
                                   "over random sequences repeated once (Olsson et al. 2022)")}


def _frame(model: Model) -> tuple[list[int], list[int], list[int]]:
    """(the special ids the tokenizer puts before a text, those after it, the ids random tokens are drawn from)."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise UserError(f"{model.info.name} has no tokenizer to draw random tokens from")
    prep = model.prepare("a", max_tokens=None)
    ids = prep.inputs["input_ids"][0].tolist()
    special = list(prep.special)
    lead = 0
    while lead < len(ids) and special[lead]:
        lead += 1
    trail = len(ids)
    while trail > lead and special[trail - 1]:
        trail -= 1
    vocab = tok.tok.get_vocab_size()
    added = set(int(i) for i in tok.tok.get_added_tokens_decoder())
    pool = [i for i in range(vocab) if i not in added]
    if len(pool) < 2:
        raise UserError(f"{model.info.name}'s vocabulary has fewer than two ordinary tokens")
    return ids[:lead], ids[trail:], pool


def induction_scores(model: Model, seq_len: int = 50, batches: int = 4, seed: int = 0,
                     progress: Callable[[int, int], None] | None = None,
                     stop: Callable[[], bool] | None = None) -> InductionScores:
    """Every head's induction score (see the module's docstring). seq_len is cut to what the model's positions
    hold (twice, with its special tokens); progress(done, batches); stop() True raises core.progress.Stopped."""
    import torch

    from attn_explorer.analysis.atlas_build import check_model
    from attn_explorer.core import lazy as core_lazy
    from attn_explorer.core.progress import Stopped, watching

    check_model(model)
    info = model.info
    before, after, pool = _frame(model)
    T = min(int(seq_len), (info.max_positions - len(before) - len(after)) // 2)
    if T < 2:
        raise UserError(f"{info.name} reads at most {info.max_positions} tokens: too few for a sequence and its repeat")
    if int(batches) < 1:
        raise UserError(f"batches must be at least 1, got {batches}")
    rng = np.random.default_rng(seed)
    L, H = info.num_layers, info.num_heads
    total = np.zeros((L, H))
    s = len(before)
    for b in range(int(batches)):
        if stop is not None and stop():
            raise Stopped("stopped")
        r = rng.choice(pool, size=T, replace=True).tolist()
        ids = torch.tensor([before + r + r + after], device=model.device)
        with watching(stop=stop):
            t = model.trace({"input_ids": ids}, lazy=True)
        rows = slice(s + T, s + 2 * T - 1)  # the repeat's tokens R[0..T-2]
        n = ids.shape[1]
        with torch.inference_mode():
            for l, lz in enumerate(t.lazy.layers):
                k = core_lazy._rep(lz.k, lz.q.shape[1])
                logits = core_lazy.layer_logits(lz.q, k, lz.options, rows, slice(0, n), n, n)[0]  # (H, T-1, n)
                p = torch.exp(logits - lz.lse[0, :, rows].float()[..., None])
                tgt = torch.arange(s + 1, s + T)  # R[t + 1] of the first copy
                total[l] += p[:, torch.arange(T - 1), tgt].mean(-1).double().cpu().numpy()
        if progress is not None:
            progress(b + 1, int(batches))
    return InductionScores(info.name, total / int(batches), T, int(batches), int(seed))
