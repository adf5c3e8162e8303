"""The small NumPy measures every floor shares, each written once: entropy, "hide special tokens",
the log colour scale and the fit of time against n.

Plain NumPy, no torch and no Qt, so the GUI may use it as well as the analyses, the lessons and the API.
"""
from __future__ import annotations

import numpy as np

LOG_FLOOR = -4.0  # log10 of the smallest weight the log scale shows


def entropy_bits(probs, axis: int = -1) -> np.ndarray:
    """Shannon entropy of each probability row, in bits (0·log 0 = 0). A uniform row over n keys gives log2(n)."""
    p = np.asarray(probs, dtype=np.float32)  # float32 terms (half the time of float64), summed in float64
    # the floor keeps log finite and the product still vanishes
    h = -(p * np.log2(np.maximum(p, np.float32(1e-30)))).sum(axis=axis, dtype=np.float64)
    return np.maximum(h, 0.0)  # no -0.0


def renormalise_without(rows: np.ndarray, drop) -> np.ndarray:
    """Remove the key columns where `drop` is True and rescale each row to sum to 1 again (a row left
    with nothing stays zeros, never NaN)."""
    keep = ~np.asarray(drop, dtype=bool)
    r = np.asarray(rows)[..., keep]
    s = r.sum(axis=-1, keepdims=True)
    return np.divide(r, s, out=np.zeros_like(r), where=s > 0)


def without_specials(att: np.ndarray, special) -> np.ndarray:
    """(..., N, N) attention with the special tokens' rows and columns removed and each row
    renormalised over the remaining keys ("hide special tokens"). Unchanged when no token is special,
    or when every token is (nothing would be left to show)."""
    drop = np.asarray(special, dtype=bool)
    if not drop.any() or drop.all():
        return att
    keep = np.flatnonzero(~drop)
    return renormalise_without(np.asarray(att)[..., keep, :], drop)


def log_weights(a: np.ndarray) -> np.ndarray:
    """log10 of attention weights, floored at LOG_FLOOR (the log colour scale)."""
    return np.log10(np.maximum(np.asarray(a, dtype=np.float32), np.float32(10.0**LOG_FLOOR)))


def display_values(a: np.ndarray, log: bool) -> tuple[np.ndarray, tuple[float, float]]:
    """Values to draw and their colour levels: weights in [0, 1], or log10 weights in [LOG_FLOOR, 0]."""
    if log:
        return log_weights(a), (LOG_FLOOR, 0.0)
    return np.asarray(a), (0.0, 1.0)
