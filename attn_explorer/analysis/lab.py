"""The induction and retrieval lab (issue 27, part B): checks that the heads a score ranks first matter.

Induction check. Repeated random tokens (a random sequence R of length T, then R again, as
analysis.atlas_induction scores them): on the repeat, a model with induction heads predicts R[t + 1] from
the copy of R[t], so its loss there is low. Switching off (zero ablation, api.hooks: each head's output
before W_O set to 0) the top-k heads by induction score should raise that loss more than switching off k
heads drawn at random from the other heads. We report the clean loss, the loss with the top-k off, and the
mean and spread (standard deviation) of the loss over `random_sets` random sets of k heads. Every
condition sees the same random sequences.

The retrieval half (needle in a haystack, Wu et al. 2024) is analysis.lab_retrieval.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from attn_explorer.errors import UserError

if TYPE_CHECKING:
    from attn_explorer.api.model import Model


def ranked_heads(scores: np.ndarray) -> list[tuple[int, int]]:
    """(layer, head) by score, highest first (ties in layer, head order); NaN scores last."""
    s = np.asarray(scores, dtype=np.float64)
    flat = np.where(np.isfinite(s.ravel()), s.ravel(), -np.inf)
    order = np.argsort(-flat, kind="stable")
    H = s.shape[1]
    return [(int(i // H), int(i % H)) for i in order]


def check_scores(model: Model, scores, what: str = "scores") -> np.ndarray:
    """scores as an (L, H) float array matching the model's heads, or one UserError line."""
    s = np.asarray(getattr(scores, "scores", scores))
    info = model.info
    if s.ndim != 2 or s.shape != (info.num_layers, info.num_heads):
        raise UserError(f"{what} have shape {tuple(s.shape)}, but {info.name} has {info.num_layers} layers × "
                        f"{info.num_heads} heads")
    if not np.issubdtype(s.dtype, np.number):
        raise UserError(f"{what} are not numbers ({s.dtype})")
    return s.astype(np.float64)


def random_head_sets(all_heads: list[tuple[int, int]], exclude: list[tuple[int, int]], k: int, sets: int,
                     seed: int) -> list[list[tuple[int, int]]]:
    """`sets` sets of k heads each, drawn without replacement from the heads not in exclude."""
    pool = [h for h in all_heads if h not in set(exclude)]
    if len(pool) < k:
        raise UserError(f"only {len(pool)} heads remain outside the top {len(exclude)}: too few for random "
                        f"sets of {k}")
    rng = np.random.default_rng(seed)
    return [[pool[i] for i in sorted(rng.choice(len(pool), size=k, replace=False))] for _ in range(sets)]


@dataclass
class AblationCheck:
    """Plain figures of one check: the top heads' effect against random heads'. `what` names the measure
    (a loss: higher is worse; an accuracy: lower is worse)."""

    model: str
    what: str  # "loss on the repeat (nats/token)" or "needle accuracy"
    clean: float
    top_heads: list[tuple[int, int]]
    top: float  # the measure with the top heads off
    random_heads: list[list[tuple[int, int]]]
    random: list[float]  # the measure with each random set off
    higher_is_worse: bool = True

    @property
    def random_mean(self) -> float:
        return float(np.mean(self.random)) if self.random else float("nan")

    @property
    def random_spread(self) -> float:
        return float(np.std(self.random)) if self.random else float("nan")

    @property
    def top_effect(self) -> float:
        """How much worse the measure is with the top heads off (positive: worse)."""
        return (self.top - self.clean) if self.higher_is_worse else (self.clean - self.top)

    @property
    def random_effect(self) -> float:
        return (self.random_mean - self.clean) if self.higher_is_worse else (self.clean - self.random_mean)

    @property
    def passed(self) -> bool:
        """The top heads' effect exceeds the random sets' mean effect."""
        return self.top_effect > self.random_effect

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(random_mean=self.random_mean, random_spread=self.random_spread, top_effect=self.top_effect,
                 random_effect=self.random_effect, passed=self.passed)
        return d

    def summary(self) -> str:
        heads = ", ".join(f"L{l}H{h}" for l, h in self.top_heads)
        return (f"{self.what}: clean {self.clean:.4f}; top {len(self.top_heads)} off ({heads}) {self.top:.4f}; "
                f"{len(self.random)} random sets off {self.random_mean:.4f} ± {self.random_spread:.4f}; "
                f"{'top heads matter more' if self.passed else 'top heads do NOT matter more'}")


def repeated_sequences(model: Model, seq_len: int, batches: int, seed: int) -> tuple[list[list[int]], int, int]:
    """(the inputs: special ids, R, R, special ids; T; where R starts) for `batches` random sequences R,
    drawn as analysis.atlas_induction draws them, T cut to the model's positions."""
    from attn_explorer.analysis.atlas_induction import _frame

    before, after, pool = _frame(model)
    T = min(int(seq_len), (model.info.max_positions - len(before) - len(after)) // 2)
    if T < 2:
        raise UserError(f"{model.info.name} reads at most {model.info.max_positions} tokens: too few for a "
                        "sequence and its repeat")
    rng = np.random.default_rng(seed)
    seqs = []
    for _ in range(int(batches)):
        r = rng.choice(pool, size=T, replace=True).tolist()
        seqs.append(before + r + r + after)
    return seqs, T, len(before)


def repeat_loss(model: Model, seqs: list[list[int]], T: int, start: int, ablate: dict | None = None) -> float:
    """Mean cross-entropy (nats) of predicting R[t + 1] at the repeat's copy of R[t], t = 0..T-2, over seqs,
    with the heads of ablate ({(layer, head): "zero"}) switched off."""
    import torch

    total = 0.0
    rows = torch.arange(start + T, start + 2 * T - 1)
    for ids in seqs:
        x = torch.tensor([ids], device=model.device)
        with torch.inference_mode():
            t = model.trace({"input_ids": x}, ablate=ablate or None)
            logits = model.module.logits(t.out.hidden[:, rows]).float()[0]  # (T-1, vocab)
            target = x[0, rows + 1].to(logits.device)  # R[t + 1] in the repeat
            total += float(torch.nn.functional.cross_entropy(logits, target))
    return total / len(seqs)


def induction_ablation(model: Model, scores, top: int = 5, random_sets: int = 5, seed: int = 0,
                       seq_len: int = 50, batches: int = 4,
                       progress: Callable[[int, int], None] | None = None) -> AblationCheck:
    """The induction check (module docstring). scores: (L, H) induction scores (or an InductionScores)."""
    from attn_explorer.analysis.atlas_build import check_model

    check_model(model)
    if not getattr(model.module, "causal", False) or not hasattr(model.module, "logits"):
        raise UserError(f"{model.info.name} is not a decoder with a language-model head: the induction check "
                        "measures the loss of predicting the repeat")
    s = check_scores(model, scores, "induction scores")
    k, sets = int(top), int(random_sets)
    if k < 1 or sets < 1:
        raise UserError(f"top and random_sets must be at least 1, got {top} and {random_sets}")
    ranked = ranked_heads(s)
    top_heads = ranked[:k]
    randoms = random_head_sets(ranked, top_heads, k, sets, seed)
    seqs, T, start = repeated_sequences(model, seq_len, batches, seed)
    done, total = 0, 2 + sets

    def step():
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    clean = repeat_loss(model, seqs, T, start)
    step()
    top_loss = repeat_loss(model, seqs, T, start, {h: "zero" for h in top_heads})
    step()
    rand = []
    for heads in randoms:
        rand.append(repeat_loss(model, seqs, T, start, {h: "zero" for h in heads}))
        step()
    return AblationCheck(model.info.name, "loss on the repeat (nats/token)", clean, top_heads, top_loss, randoms,
                         rand, higher_is_worse=True)
