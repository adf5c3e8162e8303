"""The picture kit: a query's attention over an image's patches, blended over the photo in NumPy.

Shared by the explorer's patch overlay and the rollout page.
"""
from __future__ import annotations

import numpy as np

from attn_explorer.gui.widgets.heatmap import lut_rgb
from attn_explorer.maths import clipped_label, clipped_values, kept_tokens, rows_without_specials

THUMB = 112  # side of a small overlay, in pixels
CLIP_PERCENTILE = 98  # colour runs from 0 to this percentile of the map; stronger patches saturate


def patch_heat(att_row: np.ndarray, grid: tuple[int, int], offset: int, special=None) -> np.ndarray:
    """A query's attention over the patches, as a (rows, cols) map; patch tokens start at `offset`
    (RunResult.patch_offset: [CLS], [DIST] or registers come first). With `special` (bool (N,)), the
    row is first renormalised over the other keys, as "hide special tokens" does in every view."""
    rows, cols = grid
    if special is not None:
        full = np.zeros(len(att_row), dtype=np.float32)
        keep = kept_tokens(special, len(att_row))
        full[keep] = rows_without_specials(np.asarray(att_row, dtype=np.float32), special)
        att_row = full
    return att_row[offset: offset + rows * cols].reshape(rows, cols)


def heat_levels(heat: np.ndarray, log: bool = False) -> tuple[np.ndarray, tuple[float, float]]:
    """(rows, cols) colour positions in 0..1 and the colour bar's levels: weights from 0 to the map's
    98th percentile, or (log) log10 weights over LOG_DECADES below it (`maths.clipped_values`)."""
    values, (lo, hi), _ = clipped_values(heat, log, CLIP_PERCENTILE)
    q = np.clip((values - lo) / (hi - lo), 0, 1) if hi > lo else np.zeros_like(values)
    return q.astype(np.float32), (lo, hi)


def heat_label(what: str, log: bool) -> str:
    """The colour bar's title over a picture: what, on which scale, topped at the 98th percentile."""
    return clipped_label(what, log, CLIP_PERCENTILE)


def upsample(q: np.ndarray, h: int, w: int, smooth: bool) -> np.ndarray:
    """(rows, cols) -> (h, w): nearest patch (blocky) or bilinear between patch centres (smooth)."""
    rows, cols = q.shape
    if not smooth:
        return q[(np.arange(h) * rows // h)][:, (np.arange(w) * cols // w)]

    def axis(n_out: int, n_in: int):
        x = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        i0 = np.minimum(x.astype(int), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, (x - i0).astype(np.float32)

    y0, y1, fy = axis(h, rows)
    x0, x1, fx = axis(w, cols)
    top = q[y0][:, x0] * (1 - fx) + q[y0][:, x1] * fx
    bottom = q[y1][:, x0] * (1 - fx) + q[y1][:, x1] * fx
    return top * (1 - fy[:, None]) + bottom * fy[:, None]


def blend(image: np.ndarray, heat: np.ndarray, alpha: float, cmap: str, smooth: bool = False,
          log: bool = False) -> np.ndarray:
    """The picture with `heat` (rows, cols) stretched over it, coloured 0..98th percentile (or on the log
    scale, `heat_levels`), mixed by `alpha`."""
    h, w = image.shape[:2]
    q, _ = heat_levels(heat, log)
    up_q = upsample(q, h, w, smooth)  # (h, w) in 0..1
    colours = lut_rgb(cmap)[(up_q * 255).astype(np.uint8)]  # (h, w, 3)
    # opacity grows with the weight, so the photo shows through where the head does not look
    a = (alpha * np.sqrt(up_q))[..., None]
    out = image.astype(np.float32) * (1.0 - a) + colours.astype(np.float32) * a
    return out.astype(np.uint8)


def thumbnail(image: np.ndarray, side: int = THUMB) -> np.ndarray:
    h, w = image.shape[:2]
    yi = (np.arange(side) * h // side)
    xi = (np.arange(side) * w // side)
    return image[yi][:, xi]
