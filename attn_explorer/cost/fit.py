"""Power-law fits, and whether the timings behind them can be trusted.

A slope p of y = a·n^p on log-log axes says how a cost grows: 2 means doubling n quadruples it,
1 means it doubles it.

Which points a slope uses (`large_n_fit`): only the large-n range, where the growing part of the
cost outweighs the fixed part. At small n a fixed cost hides the growth: Python's per-call
overhead in time; in memory, the one score tile chunked attention keeps. A cost y = c + g(n)
reaches `GROWTH` (4) times its smallest value only once g(n) > 3c, so the fit starts at the first
n whose cost is at least 4× the smallest measured, and always keeps at least the 3 largest n.
When no n reaches 4×, fixed overhead dominates every size measured and no slope is given.

`noise_verdict` is the one judgement of whether timings are too noisy to read a slope from,
shared by the Cost page and the `cost` command.

`quadratic_fit` is the one time-against-n fit of a whole model (the explorer's n sweep): forward ms
≈ a·n² + b·n + c, with the reason when the data cannot carry one, how much doubling n multiplies the
fitted time, and the n² term's share of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

GROWTH = 4.0  # the fit starts where the cost is this many times its smallest value
MIN_POINTS = 3  # ... or at the 3rd largest n, if that comes first
SPREAD_LIMIT = 0.5  # noisy: a point's slowest run exceeds its fastest by more than this share of the median
SLOWER_LIMIT = 0.8  # noisy: at a larger n (in the fit range) the median fell below this share of a smaller n's
FLAT_SLOWER_LIMIT = 0.5  # ... or, where the cost never grew 4×, below this share
SLOPE_RANGE = (0.0, 3.0)  # no variant's time shrinks with n; n² is the most (3 leaves room for cache effects)
MAX_REASONS = 2  # the verdict's sentence names this many problems and counts the rest
FIT_MIN_LENGTHS = 5  # distinct n a quadratic fit needs before it is drawn
FIT_MIN_SPAN = 4.0  # and how many times the longest n must exceed the shortest

FIT_RULE = (f"slopes p are fitted over the large-n points only, from the first n whose cost is ≥ {GROWTH:g}× "
            "its smallest: there fixed per-call overhead no longer hides the growth (no p if it never grew that much)")


@dataclass(frozen=True)
class PowerFit:
    """y ≈ a·n^p, fitted by least squares on (log n, log y)."""

    a: float  # prefactor
    p: float  # slope on log-log axes
    n_min: int  # smallest n used in the fit
    n_max: int  # largest n used in the fit
    points: int  # how many points the fit used


def fit_power_law(ns: Iterable[float], ys: Iterable[float]) -> PowerFit | None:
    """Least-squares fit of log y = log a + p·log n. None with fewer than 2 distinct n."""
    pts = [(float(n), float(y)) for n, y in zip(ns, ys) if n > 0 and y is not None and y > 0]
    if len({n for n, _ in pts}) < 2:
        return None
    xs = [math.log(n) for n, _ in pts]
    ls = [math.log(y) for _, y in pts]
    mx, my = sum(xs) / len(xs), sum(ls) / len(ls)
    sxx = sum((x - mx) ** 2 for x in xs)
    p = sum((x - mx) * (y - my) for x, y in zip(xs, ls)) / sxx
    a = math.exp(my - p * mx)
    return PowerFit(a=a, p=p, n_min=int(min(n for n, _ in pts)), n_max=int(max(n for n, _ in pts)),
                    points=len(pts))


def large_n_range(ns: Iterable[float], ys: Iterable[float]) -> list[tuple[float, float]]:
    """The (n, y) points a slope is fitted over, sorted by n: see the module docstring."""
    pts = sorted((n, y) for n, y in zip(ns, ys) if y is not None and y > 0)
    if not pts:
        return []
    lowest = min(range(len(pts)), key=lambda i: pts[i][1])
    floor = pts[lowest][1]  # searched after the cheapest n: a slow small n (a load spike) starts nothing
    start = next((i for i in range(lowest, len(pts)) if pts[i][1] >= GROWTH * floor), None)
    if start is None:  # the cost never grew 4×: overhead dominates every n measured, no slope to read
        return []
    return pts[min(start, max(0, len(pts) - MIN_POINTS)):]


def large_n_fit(ns: Iterable[float], ys: Iterable[float]) -> PowerFit | None:
    """The power-law fit over the large-n range; None when the cost never grew 4× (or < 2 sizes)."""
    pts = large_n_range(ns, ys)
    return fit_power_law([n for n, _ in pts], [y for _, y in pts])


def _by_variant(records: Iterable[Mapping], key: str) -> dict[str, list[Mapping]]:
    """Measured ("ok") records with a value for key, per variant, sorted by n."""
    out: dict[str, list[Mapping]] = {}
    for r in records:
        r = r if isinstance(r, Mapping) else r.__dict__
        if r.get("status") == "ok" and r.get(key) is not None:
            out.setdefault(r["impl"], []).append(r)
    return {impl: sorted(rs, key=lambda r: r["n"]) for impl, rs in out.items()}


def slopes(records: Iterable[Mapping], key: str) -> dict[str, PowerFit | None]:
    """Per variant, the large-n fit of records[key] against records["n"].

    records are Measurement dicts (or objects with the same fields); only status "ok" counts.
    """
    return {impl: large_n_fit([r["n"] for r in rs], [r[key] for r in rs])
            for impl, rs in _by_variant(records, key).items()}


@dataclass(frozen=True)
class Verdict:
    """Whether a sweep's timings are too noisy to read slopes from, and why."""

    reasons: tuple[str, ...]  # one short clause per problem found; empty when the timings look sound

    @property
    def noisy(self) -> bool:
        return bool(self.reasons)

    def line(self) -> str:
        """One sentence for the user; '' when the timings look sound."""
        if not self.reasons:
            return ""
        shown = list(self.reasons[:MAX_REASONS])
        if len(self.reasons) > MAX_REASONS:
            shown.append(f"and {len(self.reasons) - MAX_REASONS} more")
        return ("These timings are noisy (" + "; ".join(shown) + "): is another program busy? "
                "Slopes and speed ratios are not reliable; measure again on a quiet machine.")


def noise_verdict(records: Iterable[Mapping]) -> Verdict:
    """Noisy when, inside the large-n fit range, a point's runs spread wide relative to its median
    or a larger n ran faster than a smaller one, or when a time slope is impossible for attention.
    Small n is left out: there a microsecond of jitter is a wide spread, and no slope reads it."""
    records = list(records)
    reasons: list[str] = []
    beside = [r for r in records if r.get("beside")]  # session.cost_sweep: other work ran while it was measured
    if beside:
        r = beside[0]
        reasons.append(f"{len(beside)} point{'s' if len(beside) > 1 else ''} measured beside other work (n = {r['n']:,}, "
                       f"{r['impl']}: {', '.join(sorted(r['beside']))})")
    for impl, rs in _by_variant(records, "ms").items():
        fitted = large_n_range([r["n"] for r in rs], [r["ms"] for r in rs])
        in_fit = {n for n, _ in fitted}
        wide = [r for r in rs if r["n"] in in_fit and len(r.get("ms_runs") or []) >= 2
                and (max(r["ms_runs"]) - min(r["ms_runs"])) > SPREAD_LIMIT * r["ms"]]
        if wide:
            r = max(wide, key=lambda r: (max(r["ms_runs"]) - min(r["ms_runs"])) / r["ms"])
            reasons.append(f"{impl}'s runs at n = {r['n']:,} spread {min(r['ms_runs']):.3g}–{max(r['ms_runs']):.3g} ms "
                           f"around a median of {r['ms']:.3g} ms")
        # where the cost never grew, only a large fall counts: there jitter is most of the time
        pairs, limit = (fitted, SLOWER_LIMIT) if fitted else (sorted((r["n"], r["ms"]) for r in rs), FLAT_SLOWER_LIMIT)
        for (n0, y0), (n1, y1) in zip(pairs, pairs[1:]):
            if n1 > n0 and y1 < limit * y0:
                reasons.append(f"{impl} was faster at n = {int(n1):,} ({y1:.3g} ms) than at n = {int(n0):,} ({y0:.3g} ms)")
                break
        fit = fit_power_law([n for n, _ in fitted], [y for _, y in fitted])
        if fit is not None and not SLOPE_RANGE[0] <= fit.p <= SLOPE_RANGE[1]:
            reasons.append(f"{impl}'s time slope {fit.p:.2f} is impossible for attention "
                           f"(between {SLOPE_RANGE[0]:g} and {SLOPE_RANGE[1]:g})")
    return Verdict(tuple(reasons))


# ------------------------------------------------------------------------ a model's time against n
@dataclass(frozen=True)
class QuadraticFit:
    """Forward ms ≈ a·n² + b·n + c over measured (n, ms), or why there is no such fit. Plain data."""

    coeffs: tuple[float, float, float] | None  # (a, b, c); None when the data cannot carry a fit
    reason: str  # why there is no fit; "" when there is one
    n_min: int = 0  # the measured n the fit spans (0 when nothing was measured)
    n_max: int = 0
    doubling: float | None = None  # fitted time at n_max over that at n_max / 2 (4 for pure n², 2 for pure n)
    quadratic_share: float | None = None  # the n² term's part of the fitted time at n_max (0..1)

    def at(self, ns) -> np.ndarray:
        """The fitted ms at ns (the fit must exist)."""
        return np.polyval(np.asarray(self.coeffs, dtype=np.float64), np.asarray(ns, dtype=np.float64))


def doubling_factor(coeffs, n: float) -> float | None:
    """How many times longer the fitted time is at n than at n/2 (4 for pure n², 2 for pure n)."""
    if coeffs is None or n < 2:
        return None
    lo, hi = float(np.polyval(coeffs, n / 2)), float(np.polyval(coeffs, n))
    return hi / lo if lo > 0 and hi > 0 else None


def quadratic_share(coeffs, n: float) -> float | None:
    """The n² term's part of the fitted time at n (0..1), or None when the fit is not positive there."""
    if coeffs is None:
        return None
    total = float(np.polyval(coeffs, n))
    return float(coeffs[0] * n * n / total) if total > 0 else None


def quadratic_fit(ns: Iterable[float], ms: Iterable[float]) -> QuadraticFit:
    """Least-squares a·n² + b·n + c through measured (n, ms), offered only when the data can carry it:
    at least FIT_MIN_LENGTHS distinct n spanning FIT_MIN_SPAN× or more, a positive n² term, and positive
    times over the measured n (a hill, or a curve below zero, says nothing about cost)."""
    n = np.asarray(list(ns), dtype=np.float64).ravel()
    t = np.asarray(list(ms), dtype=np.float64).ravel()
    distinct = np.unique(n[n > 0])
    lo, hi = (int(distinct[0]), int(distinct[-1])) if distinct.size else (0, 0)
    if distinct.size < FIT_MIN_LENGTHS:
        return QuadraticFit(None, f"no fit yet: it needs {FIT_MIN_LENGTHS} different n (so far {distinct.size})",
                            lo, hi)
    span = distinct[-1] / distinct[0]
    if span < FIT_MIN_SPAN:
        return QuadraticFit(None, f"no fit: n spans {span:.1f}×, a fit needs {FIT_MIN_SPAN:.0f}×", lo, hi)
    coeffs = np.polyfit(n, t, 2)
    if not coeffs[0] > 0:
        return QuadraticFit(None, "no fit: the best quadratic bends down (a > 0 needed), so the times are too noisy",
                            lo, hi)
    if np.polyval(coeffs, np.linspace(distinct[0], distinct[-1], 64)).min() <= 0:
        return QuadraticFit(None, "no fit: the best quadratic dips below 0 ms between the measured n", lo, hi)
    a, b, c = (float(v) for v in coeffs)
    return QuadraticFit((a, b, c), "", lo, hi, doubling_factor(coeffs, hi), quadratic_share(coeffs, hi))
