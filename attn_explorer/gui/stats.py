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


def fit_quadratic(ns, ms) -> np.ndarray | None:
    """Least-squares a·n² + b·n + c through measured (n, ms); None until three distinct n exist."""
    n = np.asarray(ns, dtype=np.float64)
    t = np.asarray(ms, dtype=np.float64)
    if np.unique(n).size < 3:
        return None
    return np.polyfit(n, t, 2)


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
