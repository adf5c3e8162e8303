"""Head statistics and one row of attention rollout at long inputs, from each layer's q and k alone.

A long input's run keeps no maps (core.lazy): per layer it keeps q (B, H, N, d), k (B, H_kv, M, d; before
grouped-query repetition) and each row's log-sum-exp (B, H, N). Any row of any head's map is then
exp(logit_ij - lse_i), computed again exactly. The functions here walk the maps in tiles of whole query
rows (only the columns a causal or sliding-window row can reach), so memory is O(tile), never O(n²):

- `tiled_head_stats`: every statistic of `analysis.stats` (entropy, sink share, distance, previous /
  next-token share), with the same definitions, for every head;
- `rollout_row`: attention rollout (`analysis.rollout`) for one chosen query row, as vector-matrix
  products from the top layer down: row q of Â_L ··· Â_1 is ((e_q Â_L) Â_{L-1}) ··· Â_1, and each product
  needs only the rows of Â_l where the vector is not zero (for a causal model, the tokens up to q).

Both take the layers as `LayerQK` records (tensors and the layer's options), so they work on any
store that keeps q, k and lse, and report `progress(fraction, message)` after every tile: a worker's
progress callback that raises on cancel stops them there.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from attn_explorer.analysis.rollout import FUSIONS, check_ratio
from attn_explorer.analysis.stats import HeadStats
from attn_explorer.core.attention import AttentionOptions
from attn_explorer.core.lazy import LayerOptions, logits_block
from attn_explorer.core.hooks import Hooks
from attn_explorer.errors import UserError

TILE_ELEMENTS = 1 << 22  # probabilities per tile (H × rows × columns): 16 MB of float32, a few temporaries
LN2 = float(np.log(2.0))
PROGRESS_EVERY_S = 0.05  # report at most this often (each report is a signal to the GUI thread)


@dataclass
class LayerQK:
    """What one layer kept instead of its maps (batch item 0 is the one measured)."""

    q: torch.Tensor  # (B, H, N, d), after RoPE and norms
    k: torch.Tensor  # (B, H_kv, M, d), before grouped-query repetition
    lse: torch.Tensor  # (B, H, N) float32: each row's log-sum-exp of its masked logits
    opts: LayerOptions | AttentionOptions  # how its logits are formed: causal, window, scale (d_k slider), softcap, mask
    head_dim: int  # d_k (what the default 1/sqrt(d_k) scale reads)


Progress = Callable[[float, str], None] | None


class _Reporter:
    """Calls progress(fraction, message) at most every PROGRESS_EVERY_S, and always at the end."""

    def __init__(self, progress: Progress, total: int, what: str):
        self.progress, self.total, self.what = progress, max(1, total), what
        self.done, self.last = 0, 0.0

    def step(self, label: str) -> None:
        self.done += 1
        now = time.perf_counter()
        if self.progress is not None and (now - self.last >= PROGRESS_EVERY_S or self.done >= self.total):
            self.last = now
            self.progress(min(1.0, self.done / self.total), f"{self.what}: {label}")


def _heads_rep(k: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, H_kv, M, d) -> (B, H, M, d): grouped-query repetition (no copy where H_kv = H)."""
    r = heads // k.shape[1]
    return k if r == 1 else k.repeat_interleave(r, dim=1)


def _rows_per_tile(layer: LayerQK) -> int:
    H, N = layer.q.shape[1], layer.q.shape[2]
    M = layer.k.shape[2]
    w = layer.opts.window
    width = M if w is None else min(M, 2 * w)
    rows = max(1, TILE_ELEMENTS // (H * width))
    if w is not None:
        rows = min(rows, w)  # a tile's columns then span at most 2·window
    return min(rows, N)


def _columns(layer: LayerQK, a: int, b: int) -> tuple[int, int]:
    """The keys query rows a..b-1 can reach: all of them, or for a causal layer those up to row b-1 (and, with
    a window, from row a's first one on). Every weight outside is exactly 0."""
    N, M = layer.q.shape[2], layer.k.shape[2]
    o = layer.opts
    if not o.causal:
        return 0, M
    off = M - N  # query i sits at key position i + off (keys cached before the queries)
    lo = 0 if o.window is None else max(0, a + off - o.window + 1)
    return lo, min(M, b + off)


def row_tiles(layer: LayerQK, rows: tuple[int, int] | None = None, rows_per_tile: int | None = None):
    """Yield (a, b, lo, hi, p) for query rows a..b-1 in tiles: p (H, b - a, hi - lo) float32 the exact
    probabilities of keys lo..hi-1 (every other key of these rows has weight 0)."""
    H, N = layer.q.shape[1], layer.q.shape[2]
    k = _heads_rep(layer.k, H)
    start, stop = (0, N) if rows is None else rows
    step = rows_per_tile or _rows_per_tile(layer)
    for a in range(start, stop, step):
        b = min(stop, a + step)
        yield (a, b, *_tile(layer, k, a, b))


def _tile(layer: LayerQK, k: torch.Tensor, a: int, b: int) -> tuple[int, int, torch.Tensor]:
    """(lo, hi, p) of query rows a..b-1 (see row_tiles); k already repeated to every query head."""
    N = layer.q.shape[2]
    lo, hi = _columns(layer, a, b)
    s = logits_block(layer.q, k, layer.opts, layer.head_dim, slice(a, b), N, slice(lo, hi))[0]  # (H, r, c)
    l = layer.lse[0, :, a:b, None].float()
    p = s.sub_(l).exp_()  # in place: the logits are not needed again
    if bool(torch.isneginf(l).any()):
        p.nan_to_num_(0.0)  # a row with no key: lse -inf, weights 0 (not NaN)
    return lo, hi, p


# ---- head statistics ------------------------------------------------------------------------------------

def _sink_columns(special, n: int) -> torch.Tensor:
    """bool (n,): special tokens and the first token (what `stats.sink_share` counts)."""
    sinks = torch.as_tensor(np.asarray(special, dtype=bool)).clone()
    sinks[0] = True
    return sinks


def _layer_sums(layer: LayerQK, sinks: torch.Tensor, patches: tuple | None, report: _Reporter,
                label: str) -> dict[str, np.ndarray]:
    """Per head (H,) sums over rows of: entropy, sink weight, distance, and counts of rows whose top key is
    the previous / next token; each later divided by its number of rows."""
    H, N = layer.q.shape[1], layer.q.shape[2]
    acc = {name: torch.zeros(H, dtype=torch.float64) for name in ("entropy", "sink", "distance", "prev", "next")}
    sink_weights = sinks.float()
    for a, b, lo, hi, p in row_tiles(layer):
        # each row summed in float32 (a few thousand terms), the rows in float64; no float64 copy of a tile
        acc["entropy"] += torch.special.entr(p).sum(-1).sum(-1, dtype=torch.float64) / LN2  # -p·ln p, 0 at 0
        acc["sink"] += (p @ sink_weights[lo:hi]).sum(-1, dtype=torch.float64)
        if patches is None:
            d = (torch.arange(a, b)[:, None] - torch.arange(lo, hi)[None, :]).abs().float()  # (r, c) |i − j|
            acc["distance"] += (p * d).sum(-1).sum(-1, dtype=torch.float64)
        else:
            acc["distance"] += _patch_distance_sum(p, a, b, lo, hi, *patches)
        top, where = p.max(dim=-1)  # the first of equal maxima, as NumPy's argmax
        where = torch.where(top > 0, where + lo, torch.zeros_like(where))  # a row of zeros: argmax 0
        rows = torch.arange(a, b)
        acc["prev"] += (where == rows - 1)[:, rows >= 1].sum(-1, dtype=torch.float64)
        acc["next"] += (where == rows + 1)[:, rows + 1 < N].sum(-1, dtype=torch.float64)
        report.step(label)
    return {name: v.numpy() for name, v in acc.items()}


def _patch_distance_sum(p: torch.Tensor, a: int, b: int, lo: int, hi: int, grid, offset: int,
                        patch_size: float) -> torch.Tensor:
    """(H,) Σ over the tile's patch rows of Σ_j α_ij·|centre_i − centre_j| in pixels, with each row's
    weights renormalised over the patches (`stats.patch_distance`)."""
    rows, cols = grid
    P = rows * cols
    r0, r1 = max(a, offset), min(b, offset + P)
    c0, c1 = max(lo, offset), min(hi, offset + P)
    H = p.shape[0]
    if r0 >= r1 or c0 >= c1:
        return torch.zeros(H, dtype=torch.float64)
    sub = p[:, r0 - a: r1 - a, c0 - lo: c1 - lo].double()
    s = sub.sum(-1, keepdim=True)
    sub = torch.where(s > 0, sub / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(sub))
    qi, kj = torch.arange(r0 - offset, r1 - offset), torch.arange(c0 - offset, c1 - offset)
    dr = ((qi // cols)[:, None] - (kj // cols)[None, :]).double()
    dc = ((qi % cols)[:, None] - (kj % cols)[None, :]).double()
    return (sub * (torch.hypot(dr, dc) * float(patch_size))).sum(-1).sum(-1)


def tiled_head_stats(layers: Sequence[LayerQK], special, grid: tuple[int, int] | None = None,
                     patch_offset: int = 0, patch_size: float | None = None,
                     progress: Progress = None) -> HeadStats:
    """`stats.head_stats` of every head, computed in row tiles from q, k and lse (no n² memory); the same
    numbers as the dense version (within float32 rounding).

    For images give grid (rows, cols), patch_offset and patch_size (pixels) to get distances in pixels."""
    if not layers:
        raise UserError("head statistics need at least one layer")
    N = layers[0].q.shape[2]
    if len(special) != N:
        raise UserError(f"special has {len(special)} entries for {N} tokens")
    if any(l.k.shape[2] != N for l in layers):
        raise UserError("head statistics need square maps (as many keys as queries)")
    patches = (grid, int(patch_offset), float(patch_size)) if grid is not None and patch_size else None
    sinks = _sink_columns(special, N)
    total = sum(-(-N // _rows_per_tile(l)) for l in layers)
    report = _Reporter(progress, total, "measuring every head")
    sums = [_layer_sums(l, sinks, patches, report, f"layer {i + 1} of {len(layers)}") for i, l in enumerate(layers)]
    per = {name: np.stack([s[name] for s in sums]) for name in sums[0]}  # (L, H) each
    dist_rows = grid[0] * grid[1] if patches else N
    return HeadStats(entropy=np.maximum(per["entropy"] / N, 0.0), sink=per["sink"] / N,
                     distance=per["distance"] / dist_rows,
                     prev=per["prev"] / max(1, N - 1) if N > 1 else np.zeros_like(per["prev"]),
                     next=per["next"] / max(1, N - 1) if N > 1 else np.zeros_like(per["next"]),
                     distance_unit="px" if patches else "tokens")


# ---- rollout of one query row ---------------------------------------------------------------------------

def _fuse(p: torch.Tensor, fusion: str) -> torch.Tensor:
    """(H, r, c) -> (r, c): the heads' mean, max or min (`rollout.fuse_heads`)."""
    if fusion == "mean":
        return p.mean(0)
    return p.amax(0) if fusion == "max" else p.amin(0)


def rollout_row(layers: Sequence[LayerQK], query: int, fusion: str = "mean", discard_ratio: float = 0.0,
                upto: int | None = None, progress: Progress = None) -> np.ndarray:
    """(N,) float32: row `query` of the rollout through layers 0..upto (all when None), the same as row
    `query` of `rollout.attention_rollout`, without any n×n map.

    Each layer's step is 0.5·fused + 0.5·I with rows renormalised; the vector v starts as e_query at the
    top and becomes v·step_l layer by layer down to layer 0. Only the row tiles where v is not zero are
    computed. Dropping the lowest weights needs each layer's whole map (a global quantile), so
    discard_ratio must be 0 here."""
    if fusion not in FUSIONS:
        raise UserError(f"head fusion must be one of {', '.join(FUSIONS)}, got {fusion!r}")
    if check_ratio(discard_ratio) > 0:
        raise UserError("discarding the lowest weights is not supported on a long input yet (it needs each "
                        "layer's whole map); set discard lowest to 0")
    L = len(layers)
    last = L - 1 if upto is None else int(upto)
    if not 0 <= last < L:
        raise UserError(f"layer {last} does not exist; the attention has layers 0..{L - 1}")
    N = layers[0].q.shape[2]
    if any(l.k.shape[2] != N for l in layers):
        raise UserError("rollout needs square maps (as many keys as queries)")
    if not 0 <= int(query) < N:
        raise UserError(f"query {query} does not exist; the input has tokens 0..{N - 1}")
    v = torch.zeros(N, dtype=torch.float64)
    v[int(query)] = 1.0
    todo = [l for l in range(last, -1, -1)]
    report = _Reporter(progress, sum(-(-N // _rows_per_tile(layers[l])) for l in todo), "rolling out one row")
    for step_no, l in enumerate(todo):
        v = _times_step(v, layers[l], fusion, report, f"layer {l} ({step_no + 1} of {len(todo)})")
    return v.float().numpy()


def _times_step(v: torch.Tensor, layer: LayerQK, fusion: str, report: _Reporter, label: str) -> torch.Tensor:
    """v (N,) times one layer's step matrix 0.5·fused + 0.5·I (rows renormalised), tile by tile."""
    out = torch.zeros_like(v)
    per = _rows_per_tile(layer)
    N = v.shape[0]
    k = _heads_rep(layer.k, layer.q.shape[1])  # once per layer, not per tile
    for a in range(0, N, per):
        b = min(N, a + per)
        w = v[a:b]
        if not bool((w != 0).any()):
            report.step(label)  # rows v does not reach add nothing
            continue
        lo, hi, p = _tile(layer, k, a, b)
        step = 0.5 * _fuse(p, fusion).double()  # (r, c)
        i = torch.arange(a, b)
        step[i - a, i - lo] += 0.5  # the residual: each token keeps half of itself (its own key is in reach)
        s = step.sum(-1)
        w = torch.where(s > 0, w / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(w))
        out[lo:hi] += w @ step
        report.step(label)
    return out


# ---- collecting what a run keeps ------------------------------------------------------------------------

def collect_layers(module: torch.nn.Module, inputs: dict, dk_scale: float = 1.0, dk_layers=None) -> list[LayerQK]:
    """Run `module` once keeping, per layer, q, k, lse and how its logits are formed (core.lazy.LayerOptions:
    its window, its d_k scale): the LayerQK records the functions above read. For modules run here directly
    (tests, and callers without a RunResult's lazy store)."""
    hooks = Hooks(keep=True)  # every layer keeps q, k and lse (core.hooks.KeptLayer), no maps
    with torch.inference_mode():
        module(dk_scale=dk_scale, dk_layers=dk_layers, output_attentions=False, hooks=hooks, **inputs)
    return [LayerQK(c.q, c.k, c.lse, c.options, int(c.q.shape[-1])) for _, c in sorted(hooks.kept.items())]


def layers_of(store) -> list[LayerQK]:
    """The LayerQK records of a long run's store (RunResult.lazy): a list of them as it is, or a store whose
    `layers` each hold q, k, lse, their options and head_dim."""
    items = list(store) if isinstance(store, (list, tuple)) else list(store.layers)
    if all(isinstance(l, LayerQK) for l in items):
        return items
    recurrent = [getattr(l, "kind", "") for l in items if not hasattr(l, "lse") and not isinstance(l, LayerQK)]
    if recurrent:  # a hybrid's recurrent layers (core.mamba2.KeptMamba): signed maps, no softmax rows
        raise UserError(f"the long-input head statistics and rollout need softmax maps; this run's "
                        f"{recurrent[0]} layers hold signed implicit maps (their tiles are served by RunResult.attention)")
    return [LayerQK(l.q, l.k, l.lse, l.options, int(l.q.shape[-1])) for l in items]
