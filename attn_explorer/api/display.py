"""What the grid page draws, computed where the model ran: every head max-pooled and tiled into one mosaic.

At 512 tokens, pooling and tiling (6, 12, 512, 512) weights took 60–90 ms; done in the GUI thread that
froze typing. `grid_image(attentions)` does it in the worker, in torch, right after `Model.run`, and
returns float32 NumPy arrays that `ImageItem.setImage` takes as they are: the GUI thread only sets the
image. The log-scale version is made alongside (a pass over the small mosaic, not over n×n), so toggling
the scale never needs the worker.

A long input's run keeps no maps (RunResult.is_lazy): `lazy_grid_steps(r.lazy)` fills the same mosaic head by
head from the run's store, yielding it as it fills (progress, stop), and `lazy_grid_image` returns it whole.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from attn_explorer.maths import LOG_FLOOR, hidden_tokens, log_weights, renormalise_without, without_specials

CELL_MAX = 128  # largest side of one head's cell, in mosaic pixels


@dataclass(frozen=True)
class GridImage:
    """The L×H mosaic of one run, ready to draw. Head h of layer l is the c×c block at rows l·c, columns h·c
    (c_rows×c_cols for a map that is not square: cross-attention's target × source)."""

    weights: np.ndarray  # float32 (L*c, H*c): max-pooled attention weights in [0, 1]
    log_weights: np.ndarray  # float32 (L*c, H*c): log10 of the weights, floored at LOG_FLOOR
    layers: int  # L
    heads: int  # H
    cell: int  # c: mosaic pixels per head side (N when N <= cell_max)
    hidden_specials: bool = False  # special tokens' rows and columns were dropped, rows renormalised
    cell_cols: int = 0  # mosaic pixels per head across (0: the same as `cell`, a square map)
    stack: str = "encoder"  # encoder-decoders: which maps these are ("encoder", "decoder", "cross")

    def values(self, log: bool) -> tuple[np.ndarray, tuple[float, float]]:
        """The array to draw and its colour levels."""
        return (self.log_weights, (LOG_FLOOR, 0.0)) if log else (self.weights, (0.0, 1.0))


def max_pool_last(t: torch.Tensor, k: int, dim: int) -> torch.Tensor:
    """Maximum over consecutive groups of k along `dim` (the last group may be shorter).

    Splitting a dimension is a view, so no padded copy of the n×n maps is made."""
    n = t.shape[dim]
    whole = n // k * k
    parts = []
    if whole:
        body = t.narrow(dim, 0, whole).unflatten(dim, (whole // k, k))
        parts.append(body.amax(dim + 1 if dim >= 0 else dim))
    if whole < n:
        parts.append(t.narrow(dim, whole, n - whole).amax(dim, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def pooled_heads(attentions: np.ndarray | torch.Tensor, cell_max: int = CELL_MAX) -> torch.Tensor:
    """(L, H, N, N) -> (L, H, c, c) with c = ceil(N / k) <= cell_max, by max over k×k blocks.

    The maximum, not the mean, so one sharp peak stays visible in the overview. Rows go first: that
    reduction runs over contiguous memory, and the column pass then sees a k times smaller array."""
    t = torch.as_tensor(attentions)
    N = max(t.shape[-1], t.shape[-2])  # one factor for both sides: a R×C map keeps its shape
    k = math.ceil(N / cell_max)
    if k <= 1:
        return t
    rows = max_pool_last(t, k, dim=-2)  # (L, H, c, N)
    return max_pool_last(rows, k, dim=-1)  # (L, H, c, c)


def mosaic(cells: torch.Tensor) -> torch.Tensor:
    """(L, H, r, c) -> (L*r, H*c): row block l holds layer l, column block h holds head h."""
    L, H, r, c = cells.shape
    return cells.permute(0, 2, 1, 3).reshape(L * r, H * c)


def grid_image(attentions: np.ndarray | torch.Tensor, cell_max: int = CELL_MAX, drop=None, drop_cols=None,
               sinks: np.ndarray | None = None) -> GridImage:
    """Pool and tile every head of (L, H, N, N) attention, in the calling (worker) thread.

    `drop` (bool (N,), e.g. RunResult.special) removes those tokens' rows and columns first and
    renormalises each row over the remaining keys: the GUI's "hide special tokens", by the one rule every
    view uses (`maths.without_specials`, which leaves the maps as they are when none or all are special).
    Pooling and tiling are torch's; the log scale is `maths.log_weights` on the small mosaic.
    A map that is not square (L, H, R, C) takes `drop` for its rows and `drop_cols` for its columns.
    sinks (gpt-oss's learned sinks, RunResult.sinks (L, H, N)): each cell gets the rows' sink share as its own
    first column, left of the keys (cell_cols = keys + 1), rows renormalised over the sink and the shown keys."""
    if sinks is not None:
        return _with_sinks(attentions, sinks, cell_max, drop)
    if drop_cols is not None:
        rows, cols = hidden_tokens(drop), hidden_tokens(drop_cols)
        hide = rows is not None or cols is not None
        a = np.asarray(attentions, dtype=np.float32)
        if rows is not None:
            a = a[:, :, np.flatnonzero(~rows)]
        if cols is not None:
            a = renormalise_without(a, cols)
        attentions = np.ascontiguousarray(a, dtype=np.float32)
    else:
        hide = hidden_tokens(drop) is not None
        if hide:
            attentions = without_specials(np.asarray(attentions, dtype=np.float32), drop)
    with torch.inference_mode():
        t = torch.as_tensor(attentions).float()
        L, H = int(t.shape[0]), int(t.shape[1])
        cells = pooled_heads(t, cell_max)
        weights = mosaic(cells).contiguous().numpy()
        return GridImage(weights=weights, log_weights=log_weights(weights), layers=L, heads=H,
                         cell=int(cells.shape[-2]), hidden_specials=hide, cell_cols=int(cells.shape[-1]))


def _with_sinks(attentions, sinks: np.ndarray, cell_max: int, drop) -> GridImage:
    """grid_image of square maps with the sink's share as each cell's first column (pooled over rows only)."""
    a = np.asarray(attentions, dtype=np.float32)
    s = np.asarray(sinks, dtype=np.float32)
    rows = hidden_tokens(drop)
    if rows is not None:  # hidden: rows renormalised over the sink and the kept keys, as the head page does
        keep = np.flatnonzero(~rows)
        a, s = a[..., keep[:, None], keep], s[..., keep]
        total = a.sum(-1) + s
        a, s = np.divide(a, total[..., None], where=total[..., None] > 0), np.divide(s, total, where=total > 0)
    with torch.inference_mode():
        t = torch.as_tensor(np.ascontiguousarray(a)).float()
        L, H, N = int(t.shape[0]), int(t.shape[1]), int(t.shape[-1])
        k = max(1, math.ceil(N / cell_max))
        cells = pooled_heads(t, cell_max)
        lead = torch.as_tensor(np.ascontiguousarray(s)).float()
        lead = max_pool_last(lead, k, dim=-1) if k > 1 else lead  # (L, H, c)
        cells = torch.cat([lead[..., None], cells], dim=-1)  # (L, H, c, c + 1)
        weights = mosaic(cells).contiguous().numpy()
        return GridImage(weights=weights, log_weights=log_weights(weights), layers=L, heads=H,
                         cell=int(cells.shape[-2]), hidden_specials=rows is not None, cell_cols=int(cells.shape[-1]))


# ---- long inputs: the mosaic of a lazy run, head by head through its store ---------------------------

def lazy_grid_steps(store, cell_max: int = CELL_MAX, stop=None):
    """Fill the L×H mosaic of a lazy run (api.lazy.LazyAttention, `RunResult.lazy`) one head at a time,
    each max-pooled to at most cell_max × cell_max cells from the exact probabilities (maths.pool_edges'
    blocks; a local layer computes only its band). A generator: after each head it yields
    (done, total, GridImage) with the heads so far filled in and the rest 0, so a worker's on_yield can
    draw the grid as it fills; stop() returning True (or closing the generator) ends it between heads,
    and core.lazy.Stopped is raised inside a head's pooling. Runs torch: worker threads only.

    Special tokens are not hidden here (the GridImage says hidden_specials=False)."""
    L, H, N, M = store.shape
    cr, cc = min(N, cell_max), min(M, cell_max)
    weights = np.zeros((L * cr, H * cc), dtype=np.float32)
    total = L * H
    for done, (layer, head) in enumerate(((l, h) for l in range(L) for h in range(H)), 1):
        if stop is not None and stop():
            return
        cell = store.attention(layer, head, pool=(cr, cc), reduce="max", stop=stop)
        weights[layer * cr:(layer + 1) * cr, head * cc:(head + 1) * cc] = cell
        yield done, total, GridImage(weights=weights.copy(), log_weights=log_weights(weights), layers=L, heads=H,
                                     cell=cr, cell_cols=cc if cc != cr else 0)


def lazy_grid_image(store, cell_max: int = CELL_MAX, progress=None, stop=None) -> GridImage | None:
    """The whole mosaic of a lazy run (see lazy_grid_steps), with progress(done, total) after each head;
    None when stop() ended it early."""
    image = None
    done = total = 0
    for done, total, image in lazy_grid_steps(store, cell_max, stop):
        if progress is not None:
            progress(done, total)
    return image if done == total else None
