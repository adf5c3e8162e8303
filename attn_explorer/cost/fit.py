"""Power-law fits: the slope p of y = a·n^p on log-log axes, per variant.

A slope of 2 means doubling n quadruples the cost; 1 means it doubles it.

Which points the slope uses: the larger half of the sizes measured (at least 3 when there are
3). At small n a fixed cost hides the growth: Python's per-call overhead in time, and in memory
the one score tile chunked attention keeps, or the window that is still wider than the text.
The slope is meant to say how the cost grows, so it is fitted where the growing part dominates.
Pass ``tail=1.0`` to fit every point.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping


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


def tail_fit(ns: Iterable[float], ys: Iterable[float], tail: float = 0.5) -> PowerFit | None:
    """Fit over the points with the largest n: the top `tail` share of them, at least 3 (or all)."""
    pts = sorted((n, y) for n, y in zip(ns, ys) if y is not None and y > 0)
    if not pts:
        return None
    keep = max(min(3, len(pts)), math.ceil(len(pts) * tail))
    top = pts[-keep:]
    return fit_power_law([n for n, _ in top], [y for _, y in top])


def slopes(records: Iterable[Mapping], key: str, tail: float = 0.5) -> dict[str, PowerFit | None]:
    """Per variant, the tail fit of records[key] against records["n"] over the measured points.

    records are Measurement dicts (or objects with the same fields); only status "ok" counts.
    """
    by_impl: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        r = r if isinstance(r, Mapping) else r.__dict__
        if r.get("status") == "ok" and r.get(key) is not None:
            by_impl.setdefault(r["impl"], []).append((r["n"], r[key]))
    return {impl: tail_fit([n for n, _ in pts], [y for _, y in pts], tail) for impl, pts in by_impl.items()}
