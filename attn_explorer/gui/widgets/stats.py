"""Small NumPy measures the views print next to the heatmaps (entropy, peak weight, cost fit).

Plain NumPy on arrays the GUI already holds; no model code.
"""
from __future__ import annotations

import numpy as np


def entropy_bits(probs: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shannon entropy of each probability row, in bits. A uniform row over n keys gives log2(n)."""
    p = np.asarray(probs, dtype=np.float32)
    # 0 · log 0 = 0: the floor keeps log finite and the product still vanishes
    h = -(p * np.log2(np.maximum(p, np.float32(1e-30)))).sum(axis=axis, dtype=np.float64)
    return np.maximum(h, 0.0)  # no -0.0


def head_entropy_and_peak(layer_att: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For one layer's (H, N, N) attention: mean row entropy in bits and mean max weight, per head."""
    a = np.asarray(layer_att, dtype=np.float32)
    return entropy_bits(a).mean(axis=-1), a.max(axis=-1).mean(axis=-1)


def renormalise_without(rows: np.ndarray, drop: np.ndarray) -> np.ndarray:
    """Remove the key columns where `drop` is True and rescale each row to sum to 1 again."""
    keep = ~np.asarray(drop, dtype=bool)
    r = np.asarray(rows)[..., keep]
    s = r.sum(axis=-1, keepdims=True)
    return np.divide(r, s, out=np.zeros_like(r), where=s > 0)


FIT_MIN_LENGTHS = 5  # distinct n a quadratic fit needs before it is drawn
FIT_MIN_SPAN = 4.0  # and how many times the longest n must exceed the shortest


def sound_fit(ns, ms) -> tuple[np.ndarray | None, str]:
    """Least-squares a·n² + b·n + c through measured (n, ms), and "" — or None and why there is none.

    A fit is only offered when the data can carry one: at least FIT_MIN_LENGTHS distinct n spanning
    FIT_MIN_SPAN× or more, a positive n² term, and positive times over the measured n (a hill, or a
    curve below zero, says nothing about cost)."""
    n = np.asarray(ns, dtype=np.float64).ravel()
    t = np.asarray(ms, dtype=np.float64).ravel()
    distinct = np.unique(n[n > 0])
    if distinct.size < FIT_MIN_LENGTHS:
        return None, f"no fit yet: it needs {FIT_MIN_LENGTHS} different n (so far {distinct.size})"
    span = distinct[-1] / distinct[0]
    if span < FIT_MIN_SPAN:
        return None, f"no fit: n spans {span:.1f}×, a fit needs {FIT_MIN_SPAN:.0f}×"
    fit = np.polyfit(n, t, 2)
    if not fit[0] > 0:
        return None, "no fit: the best quadratic bends down (a > 0 needed), so the times are too noisy"
    if np.polyval(fit, np.linspace(distinct[0], distinct[-1], 64)).min() <= 0:
        return None, "no fit: the best quadratic dips below 0 ms between the measured n"
    return fit, ""


def doubling_factor(fit, n: float) -> float | None:
    """How many times longer the fitted time is at n than at n/2 (4 for pure n², 2 for pure n)."""
    if fit is None or n < 2:
        return None
    lo, hi = float(np.polyval(fit, n / 2)), float(np.polyval(fit, n))
    return hi / lo if lo > 0 and hi > 0 else None


def quadratic_share(fit, n: float) -> float | None:
    """The n² term's part of the fitted time at n (0..1), or None when the fit is not positive there."""
    if fit is None:
        return None
    total = float(np.polyval(fit, n))
    return float(fit[0] * n * n / total) if total > 0 else None


def human_count(x: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (SI prefixes), for FLOPs."""
    for div, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g} {p}{unit}"
    return f"{x:.3g} {unit}".rstrip()


def without_specials(att: np.ndarray, special) -> np.ndarray:
    """(..., N, N) attention with the special tokens' rows and columns removed and each row
    renormalised over the remaining keys ("hide special tokens")."""
    drop = np.asarray(special, dtype=bool)
    if not drop.any() or drop.all():
        return att
    keep = np.flatnonzero(~drop)
    return renormalise_without(np.asarray(att)[..., keep, :], drop)
