"""Lazy, exact attention: keep each layer's q and k and each row's log-sum-exp, never the maps.

A probability is exp(logit_ij - lse_i), so any tile of any head's map (a window, a row, a column, a
pooled view) can be computed again exactly from q, k and lse, in O(tile) memory.

keep_attention is what MultiHeadAttention runs when its hooks keep q and k (core.hooks.Hooks(keep=True)): the output and
the rows' lse. On the CPU it is torch's fused flash kernel, which returns the lse with the output at
the plain fused forward's speed; a sliding-window layer runs query chunks against their key band only
(O(n·w), no n×n mask); soft-capping, autograd and other devices take a blocked path of our own.

The tile functions (head_probs, head_row, head_col, head_pooled) read one head from q (B, H, N, d),
k (B, H_kv, M, d, before grouped-query repetition), lse (B, H, N) and the layer's LayerOptions; tiles
that the causal triangle or the window hide entirely are never computed (they are exactly 0).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Callable

import torch

from attn_explorer.core import bf16_attention
from attn_explorer.core.bf16 import native_bf16
from attn_explorer.core.tiles import Bf16Tiles, Float32Tiles
from attn_explorer.core.pool_cells import _groups, _pool_axis, pool_edges  # noqa: F401 (pool_edges re-exported)
from attn_explorer.core.masks import attention_scale, chunk_start, differentiable
from attn_explorer.core.progress import Stopped, check as _check_stop  # one Stopped for forwards and tiles

_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
NEG_INF = float("-inf")


@dataclass(frozen=True)
class LayerOptions:
    """What a layer's logits need besides q and k: kept beside them so tiles are computed the layer's way."""

    causal: bool = False
    window: int | None = None  # sliding window: query i sees keys j in (i + M - N - window, i + M - N]
    scale: float = 1.0  # the logits' factor, d_k slider included (attention_scale)
    softcap: float | None = None  # logits -> softcap * tanh(logits / softcap) (Gemma 2)
    mask: torch.Tensor | None = None  # bool (True = may attend) or additive, broadcastable to (B, H, N, M)
    sinks: torch.Tensor | None = None  # gpt-oss: each head's sink logit (H,); the kept lse already includes it
    chunk: int | None = None  # Llama 4's attention chunks: query i sees keys j of its own chunk only (j <= i + M - N)
    rounded: bool = False  # the logits were rounded to bfloat16 (core.bf16_attention), and the lse is theirs

    @classmethod
    def of(cls, opts, head_dim: int, sinks: torch.Tensor | None = None, rounded: bool = False) -> "LayerOptions":
        """From an AttentionOptions: the scale worked out once (dk_scale and Gemma's query_pre_attn_scalar).
        rounded: what rounded_logits said of the forward's call."""
        return cls(causal=bool(opts.causal), window=opts.window, softcap=opts.softcap, mask=opts.mask,
                   scale=attention_scale(head_dim, opts.dk_scale, opts.scale),
                   sinks=None if sinks is None else sinks.detach(), chunk=opts.chunk, rounded=rounded)


def rounded_logits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts) -> bool:
    """Whether keep_attention runs this call in bfloat16 products (core.bf16_attention): a bfloat16 model on a
    CPU that multiplies bfloat16 natively, no mask, chunks or soft-cap, a layer of a kind where the kernel pays
    (bf16_attention.pays). Its logits are then rounded to
    bfloat16 as transformers' eager attention rounds them, its lse is theirs, and tiles must round them alike
    (LayerOptions.rounded), so that every map row sums to 1."""
    return (native_bf16() and bf16_attention.usable(q, k, v, opts.mask, opts.chunk, opts.softcap)
            and bf16_attention.pays(opts.window, opts.causal))


def _rep(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, H_kv, M, d) -> (B, H, M, d): grouped-query repetition (the tensor itself where H_kv = H)."""
    r = heads // t.shape[1]
    return t if r == 1 else t.repeat_interleave(r, dim=1)


def _additive(mask: torch.Tensor | None, dtype=torch.float32) -> torch.Tensor | None:
    """A bool mask (True = may attend) as an additive one (0 / -inf); an additive one as it is."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, NEG_INF)


def _mask_part(mask: torch.Tensor, rows: slice, cols: slice, head: slice | None = None) -> torch.Tensor:
    """The part of a (…, N or 1, M) mask that rows × cols (and heads `head`) read, 4-D, still broadcastable."""
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if head is not None and mask.shape[1] != 1:
        mask = mask[:, head]
    if mask.shape[-2] != 1:
        mask = mask[..., rows, :]
    return mask[..., cols]


def key_range(lo: int, hi: int, n: int, m: int, causal: bool, window: int | None,
              chunk: int | None = None) -> tuple[int, int]:
    """The keys [start, stop) that query rows [lo, hi) may see at all (causal: up to row + m - n; a
    window: from row + m - n - window + 1; chunks: from the start of row lo's chunk)."""
    if not causal:
        return 0, m
    off = m - n
    start = 0 if window is None else max(0, lo + off - window + 1)
    start = max(start, chunk_start(lo + off, chunk))
    return start, max(start, min(m, hi + off))


def _band_mask(rows: slice, cols: slice, n: int, m: int, causal: bool, window: int | None, device,
               chunk: int | None = None) -> torch.Tensor | None:
    """bool (r, c): which of rows × cols the causal triangle, window and chunks let through; None = all."""
    return ~_hidden(rows, cols, n, m, window, device, chunk) if causal else None


def _hidden(rows: slice, cols: slice, n: int, m: int, window: int | None, device, chunk: int | None = None):
    """bool (r, c) of a causal layer: which of rows × cols the triangle, window and chunks hide (by positions)."""
    qp = torch.arange(rows.start + m - n, rows.stop + m - n, device=device)[:, None]
    out = (kp := torch.arange(cols.start, cols.stop, device=device)[None, :]) > qp
    if window is not None:
        out |= kp <= qp - window
    if chunk is not None:  # before its query's chunk
        out |= kp < qp // chunk * chunk
    return out


def logits_block(q: torch.Tensor, k: torch.Tensor, opts, head_dim: int, rows: slice, n_total: int,
                 cols: slice | None = None) -> torch.Tensor:
    """The masked, scaled (and soft-capped) logits of query rows `rows` against keys `cols` (all keys
    when None): (B, H, r, c) float32. q (B, H, N, d), k (B, H, M, d) already repeated; opts: the layer's
    AttentionOptions (or LayerOptions)."""
    o = opts if isinstance(opts, LayerOptions) else LayerOptions.of(opts, head_dim)
    M = k.shape[-2]
    return layer_logits(q, k, o, rows, slice(0, M) if cols is None else cols, n_total, M)


def layer_logits(q: torch.Tensor, k: torch.Tensor, o: LayerOptions, rows: slice, cols: slice,
                 n_total: int, m_total: int, head: slice | None = None) -> torch.Tensor:
    """The masked, scaled (and soft-capped) logits of query rows `rows` against keys `cols`: (B, h, r, c)
    float32. q (B, h, r_all, d) and k (B, h, c_all, d) hold the same heads (already repeated); `head`
    says which of the mask's heads they are (when the mask has a head axis)."""
    if o.rounded:  # as core.bf16_attention formed them: the bfloat16 product's float32 sum, scaled, rounded once
        s = bf16_attention.rounded_product(q[:, :, rows], k[:, :, cols].transpose(-2, -1), o.scale).float()
    else:
        s = torch.matmul(q[:, :, rows].float(), k[:, :, cols].float().transpose(-2, -1)) * o.scale
    if o.softcap is not None:
        s = torch.tanh(s / o.softcap) * o.softcap
    band = _band_mask(rows, cols, n_total, m_total, o.causal, o.window, q.device, o.chunk)
    if band is not None:
        s = s.masked_fill(~band, NEG_INF)
    if o.mask is not None:
        m = _mask_part(o.mask, rows, cols, head)
        s = s.masked_fill(~m, NEG_INF) if m.dtype == torch.bool else s + m
    return s


# ---- the forward: output and lse -------------------------------------------------------------------

def keep_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts, head_dim: int,
                   block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (B, H, N, d_v), lse (B, H, N) float32) of exact attention; a row with no visible key gets
    lse = -inf and a zero output. k, v: (B, H_kv, M, d), before grouped-query repetition."""
    o = LayerOptions.of(opts, head_dim)
    if (o.window is not None or o.chunk is not None) and not o.causal:
        raise ValueError("a sliding window or attention chunks need causal attention")
    if rounded_logits(q, k, v, o):
        return bf16_attention.attention(q, k, v, o.scale, o.causal, o.window)  # issue 24 B: bf16 products
    if q.device.type == "cpu" and o.softcap is None and not differentiable(q, k, v):
        return _keep_flash_cpu(q, k, v, o)  # the CPU flash kernel reads grouped k, v itself (no repeat)
    return _keep_blocked(q, _rep(k, q.shape[1]), _rep(v, q.shape[1]), o, block)


def _row_mask(mask: torch.Tensor | None) -> bool:
    """Whether a mask is the same for every query row (a key-padding mask), so it broadcasts unsliced."""
    return mask is None or mask.dim() < 2 or mask.shape[-2] == 1


def _keep_flash_cpu(q, k, v, o: LayerOptions, chunk: int = 1024):
    """torch's CPU flash kernel, which hands back the lse. One call where the mask is causal from the
    top left (N = M) or absent; else query chunks, each against its own key range, with a small additive
    mask (a window's band: O(n·w) work and memory)."""
    B, H, N, _ = q.shape
    M = k.shape[-2]
    km = _additive(o.mask)
    if _row_mask(km) and (not o.causal or (o.window is None and o.chunk is None and N == M)):
        out, lse = _flash_cpu(q, k, v, 0.0, o.causal, attn_mask=km, scale=o.scale)
        _dead_rows(lse, km, o, slice(0, N), slice(0, M), N, M)
        return out, lse
    if o.window is not None:
        chunk = max(64, min(chunk, o.window))  # rows + window keys a chunk: little beyond the band
    if o.chunk is not None:  # query blocks on the attention chunks' edges see their own chunk's keys only
        chunk = o.chunk * max(1, chunk // o.chunk) if o.chunk <= chunk else o.chunk
    out = q.new_empty(B, H, N, v.shape[-1])
    lse = torch.empty(B, H, N, dtype=torch.float32, device=q.device)
    bands: dict = {}
    for a in range(0, N, chunk):
        _check_stop()  # issue 24: a stop asked by the caller ends the forward between query chunks
        rows = slice(a, min(N, a + chunk))
        c0, c1 = key_range(rows.start, rows.stop, N, M, o.causal, o.window, o.chunk)
        if c1 <= c0:  # nothing visible (more queries than keys): attend to nothing
            out[:, :, rows] = 0
            lse[:, :, rows] = NEG_INF
            continue
        cols = slice(c0, c1)
        # issue 24 A: without a padding mask a window's band is the same for every full chunk (its rows start
        # the same distance after its first key): made once per layer, not per chunk; and with N <= M every row
        # sees its own key, so no row can be dead (no isneginf / all pass over the mask)
        band_only = km is None and o.chunk is None
        key = (rows.stop - rows.start, c1 - c0, rows.start + M - N - c0) if band_only else None
        cm = bands.get(key) if band_only else None
        if cm is None:
            cm = _chunk_mask(km, o, rows, cols, N, M, q.device)
            if band_only:
                bands[key] = cm
        ob, lb = _flash_cpu(q[:, :, rows], k[:, :, cols], v[:, :, cols], 0.0, False, attn_mask=cm, scale=o.scale)
        if km is not None or N > M:
            _dead_rows(lb, cm, None, rows, cols, N, M)
        out[:, :, rows], lse[:, :, rows] = ob, lb
    return out, lse


def _chunk_mask(km, o: LayerOptions, rows: slice, cols: slice, n: int, m: int, device) -> torch.Tensor | None:
    """Additive (…, r, c) mask of one query chunk against its key range: the band and the layer's mask."""
    band = _band_mask(rows, cols, n, m, o.causal, o.window, device, o.chunk)
    part = None if km is None else _mask_part(km, rows, cols)
    if band is None:
        return part
    add = torch.zeros(band.shape, dtype=torch.float32, device=device).masked_fill_(~band, NEG_INF)
    return add if part is None else part + add


def _dead_rows(lse: torch.Tensor, mask, o: LayerOptions | None, rows: slice, cols: slice, n: int, m: int) -> None:
    """The flash kernel gives a row with no visible key lse 0 (and a zero output): set its lse to -inf.
    `mask` is additive (…, r or 1, c) or None; o: the causal triangle still to apply (whole-layer call)."""
    if mask is None:
        return
    blocked = torch.isneginf(mask)  # (B or 1, H or 1, r or 1, c)
    if o is not None and o.causal:  # rows see keys 0..i only: dead if every one of those is masked
        seen = torch.cumsum((~blocked).to(torch.int32), dim=-1)  # (..., 1, M): visible keys up to j (N = M)
        dead = (seen == 0)[..., 0, :]
    else:
        dead = blocked.all(dim=-1)  # (B?, H?, r or 1)
    if bool(dead.any()):
        lse.masked_fill_(dead.expand_as(lse), NEG_INF)


def _keep_blocked(q, k, v, o: LayerOptions, block: int):
    """Our own exact attention in query blocks, each against its visible key range only (soft-capping,
    autograd, GPUs): logits, their lse, exp(logit - lse) @ v. No n×n buffer; a window costs O(n·w)."""
    B, H, N, _ = q.shape
    M = k.shape[-2]
    outs, lses = [], []
    for a in range(0, N, block):
        _check_stop()
        rows = slice(a, min(N, a + block))
        c0, c1 = key_range(rows.start, rows.stop, N, M, o.causal, o.window, o.chunk)
        if c1 <= c0:
            outs.append(q.new_zeros(B, H, rows.stop - a, v.shape[-1]))
            lses.append(torch.full((B, H, rows.stop - a), NEG_INF, device=q.device))
            continue
        cols = slice(c0, c1)
        s = layer_logits(q, k, o, rows, cols, N, M)
        lse = torch.logsumexp(s, dim=-1)
        p = _probs(s, lse)
        outs.append(torch.matmul(p.to(v.dtype), v[:, :, cols]))
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)  # cat, not in place: autograd may record it


def _probs(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """exp(logits - lse) with a dead row (lse = -inf) all 0, never NaN."""
    live = torch.isfinite(lse)[..., None]
    return torch.where(live, torch.exp(s - torch.where(live, lse[..., None], 0.0)), 0.0)


# ---- tiles of one head ------------------------------------------------------------------------------

class _Head:
    """One head made ready for tiles: log p as one product a tile (core.tiles), but for soft-capping (tanh comes
    between) and the forward's rounded logits. Dead rows (lse = -inf) are set to -inf after."""

    def __init__(self, q, k, lse, o: LayerOptions, head: int, batch: int):
        H, H_kv = q.shape[1], k.shape[1]
        self.o, self.head = _batch_options(o, batch), head
        self.n, self.m = q.shape[-2], k.shape[-2]
        self.q = q[batch, head]  # (N, d), the model's dtype
        self.k = k[batch, head // (H // H_kv)]  # (M, d)
        lse = lse[batch, head].float()
        live = torch.isfinite(lse)
        self.dead = None if bool(live.all()) else ~live
        self.lse = torch.where(live, lse, 0.0)
        # a tile's log p as one product (core.tiles); bfloat16's where the CPU multiplies it (core.bf16: its error)
        kind = Bf16Tiles if self.q.dtype == self.k.dtype == torch.bfloat16 and self.q.device.type == "cpu" \
            and native_bf16() else Float32Tiles
        self.tiles = None if o.rounded or o.softcap is not None else kind(self.q, self.k, self.lse, o.scale)

    def log_probs(self, rows: slice, cols: slice) -> torch.Tensor:
        """log p of rows × cols, (r, c) float32: -inf where the mask, the triangle or the window hides a key."""
        o = self.o
        if o.rounded:  # the forward's own rounded logits (core.bf16_attention), less its lse
            s = bf16_attention.rounded_product(self.q[rows], self.k[cols].T, o.scale).float().sub_(self.lse[rows, None])
            return self._masked(s, rows, cols)
        if self.tiles is not None:
            return self._masked(self.tiles.log_probs(rows, cols), rows, cols)
        s = torch.matmul(self.q[rows].float() * o.scale, self.k[cols].float().T)  # soft-capped: tanh between
        return self._masked(s.div_(o.softcap).tanh_().mul_(o.softcap).sub_(self.lse[rows, None]), rows, cols)

    def _masked(self, s: torch.Tensor, rows: slice, cols: slice) -> torch.Tensor:
        """log p with -inf where the triangle, the window, the mask or a dead row hides it (in place)."""
        o = self.o
        if not _whole(rows, cols, self.n, self.m, o):
            s.masked_fill_(_hidden(rows, cols, self.n, self.m, o.window, s.device, o.chunk), NEG_INF)
        if o.mask is not None:
            mk = _mask_part(o.mask, rows, cols, slice(self.head, self.head + 1))[0, 0]
            s = s.masked_fill_(~mk, NEG_INF) if mk.dtype == torch.bool else s.add_(mk)
        if self.dead is not None:
            s.masked_fill_(self.dead[rows, None], NEG_INF)
        return s

    def probs(self, rows: slice, cols: slice) -> torch.Tensor:
        """Exact probabilities of rows × cols, (r, c) float32; 0 where nothing can be seen."""
        if not _visible(rows, cols, self.n, self.m, self.o):
            return torch.zeros(rows.stop - rows.start, cols.stop - cols.start, device=self.q.device)
        return self.log_probs(rows, cols).exp_()


def _batch_options(o: LayerOptions, batch: int) -> LayerOptions:
    """The layer's options for one batch row (its own padding mask)."""
    return o if o.mask is None or o.mask.dim() < 4 or o.mask.shape[0] == 1 else replace(o, mask=o.mask[batch:batch + 1])


def _visible(rows: slice, cols: slice, n: int, m: int, o: LayerOptions) -> bool:
    """Whether any of rows × cols can be non-zero under the causal triangle and the window."""
    if not o.causal:
        return True
    off = m - n
    if cols.start > rows.stop - 1 + off:  # every key is after every query
        return False
    if cols.stop - 1 < chunk_start(rows.start + off, o.chunk):  # every key is before every query's chunk
        return False
    return o.window is None or cols.stop - 1 > rows.start + off - o.window


def _whole(rows: slice, cols: slice, n: int, m: int, o: LayerOptions) -> bool:
    """Whether the triangle and the window hide none of rows × cols (no band mask needed)."""
    if not o.causal:
        return True
    off = m - n
    if cols.stop - 1 > rows.start + off:  # the first row cannot see the last key
        return False
    if cols.start < chunk_start(rows.stop - 1 + off, o.chunk):  # the last row's chunk starts after the first key
        return False
    return o.window is None or cols.start > rows.stop - 1 + off - o.window


def _span(x, size: int) -> slice:
    """None / (start, stop) / slice -> a slice with ints, clipped to [0, size)."""
    if x is None:
        return slice(0, size)
    if isinstance(x, slice):
        start, stop, step = x.indices(size)
        if step != 1:
            raise ValueError("rows and cols take contiguous ranges (step 1)")
        return slice(start, max(start, stop))
    start, stop = x
    start, stop, _ = slice(int(start), int(stop)).indices(size)
    return slice(start, max(start, stop))


def head_probs(q, k, lse, o: LayerOptions, head: int, rows=None, cols=None, batch: int = 0) -> torch.Tensor:
    """A window of one head's map at full resolution: (r, c) float32, equal to the dense map's rows × cols.
    rows / cols: None (all), (start, stop) or a slice."""
    h = _Head(q, k, lse, o, head, batch)
    R, C = _span(rows, h.n), _span(cols, h.m)
    lo, hi = key_range(R.start, R.stop, h.n, h.m, h.o.causal, h.o.window, h.o.chunk)
    c0, c1 = max(C.start, lo), min(C.stop, hi)
    if (c0, c1) == (C.start, C.stop):
        return h.probs(R, C)
    out = torch.zeros(R.stop - R.start, C.stop - C.start, device=h.q.device)
    if c0 < c1:  # only the keys these rows can see are computed (a window layer's row: its band)
        out[:, c0 - C.start:c1 - C.start] = h.probs(R, slice(c0, c1))
    return out


def head_row(q, k, lse, o: LayerOptions, head: int, row: int, batch: int = 0) -> torch.Tensor:
    """Query `row`'s weights over every key: (M,) float32."""
    return head_probs(q, k, lse, o, head, (row, row + 1), None, batch)[0]


def head_col(q, k, lse, o: LayerOptions, head: int, col: int, batch: int = 0) -> torch.Tensor:
    """Key `col`'s weight in every query's row: (N,) float32."""
    return head_probs(q, k, lse, o, head, None, (col, col + 1), batch)[:, 0]


def _visible_cells(edges: list[int], rows: slice, h: _Head, target: int) -> list[tuple[int, int]]:
    """Runs of whole column cells [a, b) (each about `target` keys) covering the keys rows can see at all (the
    causal triangle and the window leave the other cells exactly 0). Causal: the cells every row sees whole (keys
    up to the first row's own) apart from the diagonal's, whose runs alone pay the triangle's mask and waste."""
    k0, k1 = key_range(rows.start, rows.stop, h.n, h.m, h.o.causal, h.o.window, h.o.chunk)
    k0, k1 = max(k0, edges[0]), min(k1, edges[-1])
    if k1 <= k0:
        return []
    a, b, out = bisect.bisect_right(edges, k0) - 1, bisect.bisect_left(edges, k1), []
    cut = bisect.bisect_right(edges, rows.start + h.m - h.n + 1) - 1 if h.o.causal else -1
    while a < b:
        e = max(a + 1, min(b, bisect.bisect_left(edges, edges[a] + target, a + 1, b)))
        e = cut if a < cut < e else e
        out.append((a, e))
        a = e
    return out


def head_pooled(q, k, lse, o: LayerOptions, head: int, cells, reduce: str = "max", rows=None, cols=None,
                batch: int = 0, progress: Callable[[int, int], None] | None = None,
                stop: Callable[[], bool] | None = None, tile: int = 1 << 22) -> torch.Tensor:
    """One head's map (or its window rows × cols) pooled to cells = (r, c) (or an int for both): each cell
    the max or the mean of the exact probabilities it covers (maths.pool_edges' blocks). Computed in tiles
    of about `tile` elements aligned to cell edges, so memory is O(tile + r·c); tiles hidden by the causal
    triangle or the window are skipped (their cells are exactly 0). The max is taken over log-probabilities
    and exponentiated per cell (exp is monotonic), so only the mean pays an exp per element.
    progress(done, total) is called after each row block; stop() returning True raises Stopped. (r, c) float32."""
    if reduce not in ("max", "mean"):
        raise ValueError(f"reduce must be 'max' or 'mean', got {reduce!r}")
    h = _Head(q, k, lse, o, head, batch)
    R, C = _span(rows, h.n), _span(cols, h.m)
    cr, cc = (cells, cells) if isinstance(cells, int) else cells
    re, ce = pool_edges(max(1, R.stop - R.start), cr), pool_edges(max(1, C.stop - C.start), cc)
    fill = NEG_INF if reduce == "max" else 0.0
    acc = torch.full((len(re) - 1, len(ce) - 1), fill, dtype=torch.float32 if reduce == "max" else torch.float64)
    col_target = max(1, min(C.stop - C.start, 4096))
    row_target = max(1, tile // col_target)
    if h.o.window is not None:  # a band's rows see rows + window keys: short row blocks waste little
        row_target = min(row_target, max(1, h.o.window // 2))
    if h.o.chunk is not None:  # likewise a chunk's rows see their chunk only
        row_target = min(row_target, max(1, h.o.chunk // 2))
    row_groups = _groups(re, row_target)
    lowp = reduce == "max" and isinstance(h.tiles, Bf16Tiles) and h.o.mask is None and h.o.scale > 0
    ce_abs = (ce + C.start).tolist()
    for done, (ra, rb) in enumerate(row_groups, 1):
        if stop is not None and stop():
            raise Stopped("stopped")
        _check_stop()
        rs = slice(R.start + int(re[ra]), R.start + int(re[rb]))
        rloc = re[ra:rb + 1] - re[ra]
        for ca, cb in _visible_cells(ce_abs, rs, h, col_target):
            cs = slice(ce_abs[ca], ce_abs[cb])
            # lowp: the max over the tile's bfloat16 products, scaled after (core.tiles: the same numbers)
            t = h._masked(h.tiles.logits(rs, cs), rs, cs) if lowp else h.log_probs(rs, cs)
            t = t if reduce == "max" else t.exp_()
            part = _pool_axis(_pool_axis(t, rloc, reduce, 0), ce[ca:cb + 1] - ce[ca], reduce, 1)  # rows first: along c
            acc[ra:rb, ca:cb] = (h.tiles.finish(part) if lowp else part).to(acc.dtype).cpu()
        if progress is not None:
            progress(done, len(row_groups))
    if reduce == "max":
        return acc.exp_()
    area = (re[1:] - re[:-1])[:, None].double() * (ce[1:] - ce[:-1])[None, :].double()
    return (acc / area).float()
