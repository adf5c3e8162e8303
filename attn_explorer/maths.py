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
    keep = np.flatnonzero(~np.asarray(drop, dtype=bool))
    return _rescale_rows(np.asarray(rows)[..., keep])


def hidden_tokens(special) -> np.ndarray | None:
    """The tokens "hide special tokens" removes (bool (N,)), or None when it changes nothing: no token is
    special, or every token is (nothing would be left to show). Every view asks this one rule."""
    if special is None:
        return None
    drop = np.asarray(special, dtype=bool)
    return drop if drop.any() and not drop.all() else None


def kept_tokens(special, n: int, hide: bool = True) -> np.ndarray:
    """Indices of the tokens a view shows: all n, or (hide) those `hidden_tokens` leaves."""
    drop = hidden_tokens(special) if hide else None
    return np.arange(n) if drop is None else np.flatnonzero(~drop)


def without_specials(att: np.ndarray, special) -> np.ndarray:
    """(..., N, N) attention with the special tokens' rows and columns removed and each row
    renormalised over the remaining keys ("hide special tokens"). Unchanged when `hidden_tokens`
    says nothing is hidden."""
    drop = hidden_tokens(special)
    if drop is None:
        return att
    keep = np.flatnonzero(~drop)
    r = np.asarray(att)[..., keep[:, None], keep]  # one gather (a boolean mask per axis is several times slower)
    return _rescale_rows(r)


def _rescale_rows(r: np.ndarray) -> np.ndarray:
    """r (a fresh copy: the callers' fancy indexing made it) with each row divided by its sum, in place; a
    row of zeros stays zeros (never NaN)."""
    if not np.issubdtype(r.dtype, np.floating):
        r = r.astype(np.float64)
    s = r.sum(axis=-1, keepdims=True)
    return np.divide(r, s, out=r, where=s > 0)


def rows_without_specials(rows: np.ndarray, special) -> np.ndarray:
    """(..., N) attention rows with the special keys removed and renormalised (the same rule as
    `without_specials`, for rows of one query)."""
    drop = hidden_tokens(special)
    return rows if drop is None else renormalise_without(rows, drop)


def log_weights(a: np.ndarray) -> np.ndarray:
    """log10 of attention weights, floored at LOG_FLOOR (the log colour scale)."""
    return np.log10(np.maximum(np.asarray(a, dtype=np.float32), np.float32(10.0**LOG_FLOOR)))


def display_values(a: np.ndarray, log: bool) -> tuple[np.ndarray, tuple[float, float]]:
    """Values to draw and their colour levels: weights in [0, 1], or log10 weights in [LOG_FLOOR, 0]."""
    if log:
        return log_weights(a), (LOG_FLOOR, 0.0)
    return np.asarray(a), (0.0, 1.0)


CLIP_PERCENTILE = 99.0  # data-scaled maps: colour tops out here, the strongest 1% saturate
LOG_DECADES = 4.0  # and on the log scale spans this many powers of ten below that top


def clipped_values(a: np.ndarray, log: bool,
                   percentile: float = CLIP_PERCENTILE) -> tuple[np.ndarray, tuple[float, float], float]:
    """Values to draw, their colour levels and the top, for maps whose scale comes from the data
    (rollout, value norms, overlays): the colour runs from 0 to the map's `percentile`-th value, so a
    few large cells (a token's own weight, a sink) do not leave the rest one dark colour. On the log scale
    the levels are log10 of [top·10^-LOG_DECADES, top]. `top` is never 0."""
    v = np.asarray(a, dtype=np.float32)
    top = float(np.percentile(v, percentile)) if v.size else 0.0
    if not top > 0:
        top = float(v.max()) if v.size and v.max() > 0 else 1e-6
    if not log:
        return v, (0.0, top), top
    hi = float(np.log10(top))
    lo = hi - LOG_DECADES
    return np.log10(np.maximum(v, np.float32(10.0 ** lo))), (lo, hi), top


def clipped_label(what: str, log: bool, percentile: float = CLIP_PERCENTILE) -> str:
    """The colour bar's title for `clipped_values`: what is shown and that its top is a percentile."""
    p = f"{percentile:g}"
    return (f"log₁₀ {what} (top: {p}th pct)" if log else f"{what} (0 to {p}th pct)")


def pool_edges(n: int, cells: int) -> np.ndarray:
    """Where `cells` pooled cells split n items: int (cells + 1,) edges, edge c = floor(c·n / cells),
    so every item falls in exactly one cell (cells >= n: one item a cell, n cells)."""
    cells = max(1, min(int(cells), int(n)))
    return (np.arange(cells + 1, dtype=np.int64) * int(n)) // cells


def pool2d(a: np.ndarray, rows: int, cols: int, reduce: str = "max") -> np.ndarray:
    """(..., R, C) -> (..., r, c), r = min(rows, R), c = min(cols, C): each cell the max or the mean of the
    block it covers (pool_edges' blocks). The max keeps one sharp peak visible; the mean conserves each
    row's mass (a cell's mean times its width, summed over a row of cells, is the rows' mean sum)."""
    if reduce not in ("max", "mean"):
        raise ValueError(f"reduce must be 'max' or 'mean', got {reduce!r}")
    a = np.asarray(a)
    re, ce = pool_edges(a.shape[-2], rows), pool_edges(a.shape[-1], cols)
    if reduce == "max":
        out = np.maximum.reduceat(np.maximum.reduceat(a, re[:-1], axis=-2), ce[:-1], axis=-1)
        return out
    s = np.add.reduceat(np.add.reduceat(a.astype(np.float64), re[:-1], axis=-2), ce[:-1], axis=-1)
    area = np.diff(re)[:, None] * np.diff(ce)[None, :]
    return (s / area).astype(np.float32)
