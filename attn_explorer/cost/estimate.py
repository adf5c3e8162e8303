"""How long the rest of a sweep will take, from what it has measured so far.

Each variant's last measured point (its profiled first call and its median timed call) is scaled
to a later n by the growth of its work: (n / n₀)² for the exact variants, (n / n₀) for window and
linear (variants.Variant.growth). At small n a fixed overhead makes the real growth slower, so the
estimate starts high and tightens as n grows. No estimate before each variant has one point.

Before anything is measured, `prior_seconds` gives a deliberately slow guess (every variant costed
as exact attention at a low FLOP rate), so that a caller who must not start a long run by accident
errs on the side of asking first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True)
class PointCost:
    """What measuring one (n, variant) point took, in wall-clock seconds."""

    n: int
    warm_s: float  # the first call, under the memory probe (it is also the warm-up)
    run_s: float  # one timed call (the median)


def predict_seconds(seen: PointCost, n: int, growth: float, repeats: int,
                    time_budget_s: float | None = None) -> float:
    """Seconds to measure this variant at n: one warm-up call and the timed calls."""
    f = (n / seen.n) ** growth
    warm, run = seen.warm_s * f, seen.run_s * f
    timed = repeats * run
    if time_budget_s is not None:  # the sweep stops timing a point once its budget is spent
        timed = min(timed, time_budget_s + run)
    return warm + timed


# FLOPs per second assumed before anything is measured: slow on purpose (a busy 2-core laptop; a modest GPU)
PRIOR_FLOP_RATE = {"cpu": 2e9, "cuda": 2e11, "mps": 5e10}


def prior_seconds(n: int, heads: int, d_k: int, batch: int, repeats: int, device: str = "cpu",
                  time_budget_s: float | None = None) -> float:
    """A pessimistic guess, with nothing measured yet, of measuring one variant at n: one warm-up and
    `repeats` timed calls of exact attention's 4·B·H·n²·d_k FLOPs (q·kᵀ and the weighted sum of v)."""
    rate = PRIOR_FLOP_RATE.get(str(device).split(":")[0], PRIOR_FLOP_RATE["cpu"])
    call = 4.0 * batch * heads * n * n * d_k / rate
    timed = repeats * call
    if time_budget_s is not None:
        timed = min(timed, time_budget_s + call)
    return call + timed


def remaining_seconds(seen: Mapping[str, PointCost], pending: Iterable[tuple[int, str]],
                      growth: Mapping[str, float], repeats: int, time_budget_s: float | None = None) -> float | None:
    """Seconds for the pending (n, variant) points; None while some variant has no point yet."""
    total = 0.0
    for n, impl in pending:
        if impl not in seen:
            return None
        total += predict_seconds(seen[impl], n, growth[impl], repeats, time_budget_s)
    return total


def human_seconds(s: float | None) -> str:
    """'about 40 s', 'about 2 min 10 s', 'about 1 h 05 min'; '' when unknown."""
    if s is None:
        return ""
    s = max(0.0, s)
    if s < 60:
        return f"about {max(1, round(s))} s"
    if s < 3600:
        m, sec = divmod(int(round(s / 10) * 10), 60)
        return f"about {m} min {sec:02d} s" if sec else f"about {m} min"
    h, m = divmod(int(round(s / 60)), 60)
    return f"about {h} h {m:02d} min"
