"""What the views need to draw a hybrid model's layers honestly (issue 25 B): which layers are recurrent, the
signed implicit maps' diverging colour scale centred at 0 and its label, and which heads of a narrower layer do
not exist (RunResult.attentions pads them with zeros: they are drawn blank, not as zero attention).

NumPy only (no Qt, no torch): ModelInfo.mixers / layer_heads come from the loaded model, the maps from the run.
"""
from __future__ import annotations

import numpy as np

# ModelInfo.mixers' recurrent kinds -> the colour bar's and the header's words
MIXER_LABELS = {"deltanet": "implicit attention (Gated DeltaNet)", "mamba2": "implicit attention (Mamba-2)"}
# a grid row's mark per mixer (as "local 512" / "global" mark a row today)
MIXER_SHORT = {"softmax": "softmax", "deltanet": "DeltaNet", "mamba2": "Mamba-2"}
ABSENT = "no such head (this layer has fewer heads)"
NOT_PROBABILITIES = ("a signed implicit map, not probabilities: entropy, sink share, distance and the top-key "
                     "statistics do not apply")

# the diverging scale: blue (negative) - white (0) - red (positive), as RGB stops at -1, -0.5, 0, 0.5, 1
DIVERGING_STOPS = np.array([[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]],
                           dtype=np.float32)
ABSENT_RGBA = (200, 200, 200, 255)  # a padded head's cells: plain light grey


def mixer_of(info, layer: int) -> str:
    """"softmax", "deltanet", "mamba2" ... for layer of the loaded model ("softmax" where the model says none)."""
    mixers = tuple(getattr(info, "mixers", ()) or ())
    return mixers[layer] if 0 <= layer < len(mixers) else "softmax"


def is_recurrent(info, layer: int) -> bool:
    return mixer_of(info, layer) != "softmax"


def has_recurrent(info) -> bool:
    return any(k != "softmax" for k in (getattr(info, "mixers", ()) or ()))


def mixer_label(info, layer: int) -> str:
    """The map's name on its colour bar: "implicit attention (Gated DeltaNet)", or "" for a softmax layer."""
    kind = mixer_of(info, layer)
    return MIXER_LABELS.get(kind, f"implicit attention ({kind})") if kind != "softmax" else ""


def head_exists(info, layer: int, head: int) -> bool:
    """False for the padded heads of a layer with fewer heads than the widest (ModelInfo.layer_heads)."""
    heads = tuple(getattr(info, "layer_heads", ()) or ())
    return not (0 <= layer < len(heads)) or head < heads[layer]


def signed_levels(values: np.ndarray) -> tuple[float, float]:
    """Symmetric levels (-a, a) around 0 with a the largest |value| (1e-6 for an all-zero map)."""
    v = np.asarray(values, dtype=np.float32)
    a = float(np.nanmax(np.abs(v))) if v.size and np.isfinite(v).any() else 0.0
    a = a if a > 0 else 1e-6
    return -a, a


def diverging_lut(n: int = 257) -> np.ndarray:
    """(n, 3) uint8: the diverging scale, white at the middle entry (n odd: 0 maps to it exactly)."""
    x = np.linspace(0.0, 1.0, n) * (len(DIVERGING_STOPS) - 1)
    i = np.minimum(x.astype(int), len(DIVERGING_STOPS) - 2)
    f = (x - i)[:, None]
    return np.round(DIVERGING_STOPS[i] * (1 - f) + DIVERGING_STOPS[i + 1] * f).astype(np.uint8)


def diverging_rgba(values: np.ndarray, levels: tuple[float, float]) -> np.ndarray:
    """values (R, C) -> uint8 RGBA (R, C, 4) on the diverging scale between levels (0 is white)."""
    lut = diverging_lut()
    lo, hi = levels
    t = np.clip((np.nan_to_num(np.asarray(values, dtype=np.float32)) - lo) / (hi - lo), 0.0, 1.0)
    rgb = lut[np.round(t * (len(lut) - 1)).astype(int)]
    return np.concatenate([rgb, np.full(rgb.shape[:-1] + (1,), 255, np.uint8)], axis=-1)


def signed_pool(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """(R, C) -> (rows, cols): each block's value of largest magnitude, its sign kept (a max would lose the
    negative weights of a signed map)."""
    a = np.asarray(a, dtype=np.float32)
    R, C = a.shape
    if (R, C) == (rows, cols):
        return a
    re, ce = np.linspace(0, R, rows + 1).astype(int), np.linspace(0, C, cols + 1).astype(int)
    out = np.zeros((rows, cols), np.float32)
    for i in range(rows):
        for j in range(cols):
            block = a[re[i]:max(re[i + 1], re[i] + 1), ce[j]:max(ce[j + 1], ce[j] + 1)]
            out[i, j] = block.flat[int(np.argmax(np.abs(block)))]
    return out


def grid_overlay(attentions: np.ndarray, info, cell: int, cell_cols: int = 0) -> np.ndarray | None:
    """The grid's mosaic over the softmax one: (L*cell, H*cell_cols, 4) uint8 RGBA, transparent on softmax
    rows, each recurrent head on the diverging scale of its layer (symmetric around 0; from the run's signed maps
    pooled by magnitude), padded heads light grey. None when no layer is recurrent and no head is padded."""
    heads = tuple(getattr(info, "layer_heads", ()) or ())
    L, H = attentions.shape[:2]
    padded = any(0 <= l < L and heads[l] < H for l in range(len(heads)))
    if not has_recurrent(info) and not padded:
        return None
    cc = cell_cols or cell
    out = np.zeros((L * cell, H * cc, 4), np.uint8)
    for l in range(L):
        rec = is_recurrent(info, l)
        if rec:
            real = [h for h in range(H) if head_exists(info, l, h)]
            levels = signed_levels(attentions[l, real]) if real else (-1e-6, 1e-6)
        for h in range(H):
            tile = out[l * cell:(l + 1) * cell, h * cc:(h + 1) * cc]
            if not head_exists(info, l, h):
                tile[...] = ABSENT_RGBA
            elif rec:
                tile[...] = diverging_rgba(signed_pool(attentions[l, h], cell, cc), levels)
    return out


def value_text(value: float, recurrent: bool) -> str:
    """A map's cell as a read-out shows it: "0.43" (a softmax weight), "-0.0127 (signed)" (an implicit one: 3 digits)."""
    return f"{value:+.3g} (signed)" if recurrent else f"{value:.2f}"


def signed_scaled(values: np.ndarray, label: str):
    """A recurrent head's map as the head page colours it: the values themselves, symmetric levels around 0."""
    from attn_explorer.session.long_view import Scaled
    v = np.asarray(values, dtype=np.float32)
    return Scaled(v, signed_levels(v), f"{label}, signed (0 = white)")


def absent_map(shape: tuple[int, int]) -> np.ndarray:
    """A padded head's map as drawn: NaN everywhere (blank), never zeros (which would read as no attention)."""
    return np.full(shape, np.nan, np.float32)


def probability_heads(info, layers: int, heads: int) -> np.ndarray:
    """bool (L, H): True where a head's map is a softmax's probabilities (statistics apply), False on recurrent
    layers and padded heads."""
    return np.array([[not is_recurrent(info, l) and head_exists(info, l, h) for h in range(heads)]
                     for l in range(layers)], dtype=bool).reshape(layers, heads)


def softmax_only(stats, info):
    """(stats to draw with NaN (blank) where they do not apply, stats to pick findings from: +inf entropy and
    -inf elsewhere there, so no recurrent or padded head is named), or (stats, stats) for a softmax-only model."""
    from dataclasses import replace
    L, H = stats.entropy.shape
    ok = probability_heads(info, L, H)
    if ok.all():
        return stats, stats
    names = ("entropy", "sink", "distance", "prev", "next")
    drawn = replace(stats, **{k: np.where(ok, getattr(stats, k), np.nan) for k in names})
    picks = replace(stats, **{k: np.where(ok, getattr(stats, k), np.inf if k == "entropy" else -np.inf)
                              for k in names})
    return drawn, picks


def overview_note(info, layers: int) -> str:
    """The overview's sentence on blank rows ("" for a softmax-only model)."""
    rec = [l for l in range(layers) if is_recurrent(info, l)]
    if not rec:
        return ""
    kinds = sorted({MIXER_SHORT.get(mixer_of(info, l), mixer_of(info, l)) for l in rec})
    return (f" Layers {', '.join(map(str, rec))} ({' / '.join(kinds)}) are left blank: {NOT_PROBABILITIES}.")


def rows_overlay(rows: np.ndarray, info, layers: int, heads: int) -> np.ndarray | None:
    """The token page's (L·H, K) rows (one query's row per head): (L·H, K, 4) uint8 RGBA, transparent on softmax
    rows, recurrent rows on the diverging scale (symmetric per layer), padded heads grey; None where nothing is."""
    if rows.shape[0] != layers * heads:
        return None
    ok = probability_heads(info, layers, heads)
    if ok.all():
        return None
    out = np.zeros(rows.shape + (4,), np.uint8)
    for l in range(layers):
        real = [h for h in range(heads) if head_exists(info, l, h)]
        if is_recurrent(info, l) and real:
            levels = signed_levels(rows[[l * heads + h for h in real]])
            for h in real:
                out[l * heads + h] = diverging_rgba(rows[None, l * heads + h], levels)[0]
        for h in range(heads):
            if not head_exists(info, l, h):
                out[l * heads + h] = ABSENT_RGBA
    return out


def signed_shade(values: np.ndarray) -> np.ndarray:
    """(K,) signed weights -> (K, 3) uint8 colours on the diverging scale (symmetric around 0)."""
    return diverging_rgba(np.asarray(values, np.float32)[None], signed_levels(values))[0, :, :3]


def signed_strip(row: np.ndarray, width: int, tag: int, layer: int, head: int, query: int, top: int = 6):
    """long_view.strip_of_row for a signed row: each pooled cell keeps the value of largest magnitude (its sign
    too), and the keys it reads most are those of largest |A| (a max would name tiny positives)."""
    from attn_explorer.maths import pool_edges
    from attn_explorer.session.long_view import Strip
    row = np.asarray(row, dtype=np.float32)
    n = row.shape[0]
    edges = pool_edges(n, max(1, int(width)))
    values = np.array([row[a:b][int(np.argmax(np.abs(row[a:b])))] for a, b in zip(edges[:-1], edges[1:])],
                      np.float32) if n else row
    best = np.argsort(-np.abs(row), kind="stable")[:min(top, n)]
    return Strip(tag, int(layer), int(head), int(query), values, edges, [(int(j), float(row[j])) for j in best], n)


def recurrent_layers(info) -> list[int]:
    """The layers whose maps are signed implicit ones (empty for a softmax-only model)."""
    return [l for l in range(len(getattr(info, "mixers", ()) or ())) if is_recurrent(info, l)]


def signed_without_specials(a: np.ndarray, special) -> np.ndarray:
    """(..., N, N) signed map with the specials' rows and columns dropped as "hide special tokens" drops them,
    NOT renormalised (a signed row has no sum to restore: output_t = Σ_s A[t, s] v_s over every s)."""
    from attn_explorer.maths import kept_tokens
    a = np.asarray(a)
    keep = kept_tokens(special, a.shape[-1])
    return a if len(keep) == a.shape[-1] else a[..., keep, :][..., keep]


def head_note(info, layer: int, head: int) -> str:
    """The head page's header line on a hybrid's head (HTML): absent, or what its signed map means; "" else."""
    if not head_exists(info, layer, head):
        return f"<br><b>Head {head} does not exist in layer {layer}</b>: {ABSENT}; drawn blank."
    if is_recurrent(info, layer):
        return (f"<br>{mixer_label(info, layer)}: row t holds the weights A[t, s] with output t = Σ_s A[t, s]·v_s "
                "— signed, rows need not sum to 1 (blue &lt; 0 &lt; red).")
    return ""
