"""Exact attention and four ways around its n×n score grid, side by side.

Every variant takes the same arguments as exact attention,
``fn(q, k, v, mask=None, scale=None, causal=False, ...) -> output``, with q, k, v shaped
(B, H, N, d_k) and the output shaped (B, H, N, d_v):

- ``naive``: build the whole (B, H, N, M) softmax. The reference; O(N·M) memory.
- ``chunked``: FlashAttention's algorithm in PyTorch. Tiles of queries meet tiles of keys and an
  online softmax (running max and running sum) folds each tile into the output, so only one
  (B·H, q_block, k_block) score tile exists at a time. Exact, O(N·d) memory.
- ``window``: local attention inside non-overlapping windows (Swin's partition): 1D runs of
  ``window`` tokens for text, ``window × window`` squares for a grid of image patches. O(N·w).
- ``linear``: kernelised attention with φ(x) = elu(x) + 1 (Katharopoulos et al. 2020). An
  approximation; O(N·d²).
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``, the library's own kernel.

Masks follow SDPA: a bool mask is True where a query may look at a key; a float mask is added to
the scores. Either broadcasts against (B, H, N, M). Causal masks are aligned as in core.attention:
query i sees keys j ≤ i + M − N (j ≤ i for self-attention). A query row with every key masked
gets a zero output, as in core.attention. ``window`` and ``linear`` work on self-attention (M = N).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attn_explorer.core.attention import apply_mask_, attention_scale, fused_attention, scaled_dot_product_attention


# --- naive: the reference -------------------------------------------------------------------


def naive(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float | None = None,
          causal: bool = False) -> Tensor:
    """softmax(q kᵀ · scale) v with the whole (B, H, N, M) score matrix built: the explorer's
    own exact attention (core.attention), so the cost lab measures what the views run."""
    return scaled_dot_product_attention(q, k, v, mask=mask, scale=scale, causal=causal)[0]


# --- chunked: FlashAttention's tiling and online softmax -----------------------------------


def auto_q_block(n: int) -> int:
    """chunked's query tile when none is given: 128 rows, taller as n grows, at most 1024.

    Every query block streams all of K and V once, so at large n taller blocks cut that traffic
    (twice as fast at n = 32768 on a 2-core CPU), while the score tile stays a small share of the
    O(n·d) output. cost.memory mirrors this rule to predict memory without importing torch.
    """
    return min(1024, max(128, n // 32))


def chunked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float | None = None,
            causal: bool = False, q_block: int | None = None, k_block: int = 256) -> Tensor:
    """Exact attention without the n×n matrix (FlashAttention-2's loop order, Dao 2023).

    For each block of queries, walk the key blocks keeping per row the running max m, the
    running sum l of exp(s - m) and the unnormalised output; when a later block raises the max,
    rescale what is stored by exp(m_old - m_new). Work is the same as naive; memory is the
    output plus one (B·H, q_block, k_block) tile.
    """
    B, H, N, dk = q.shape
    M, dv = k.shape[-2], v.shape[-1]
    q_block = auto_q_block(N) if q_block is None else q_block
    if q_block < 1 or k_block < 1:
        raise ValueError(f"block sizes must be positive, got q_block={q_block}, k_block={k_block}")
    sc = attention_scale(q.shape[-1], scale=scale)
    q3 = q.reshape(B * H, N, dk)  # (BH, N, d_k)
    kt3 = k.reshape(B * H, M, dk).transpose(1, 2)  # (BH, d_k, M)
    v3 = v.reshape(B * H, M, dv)  # (BH, M, d_v)
    off = M - N  # causal: query i sees keys j <= i + off
    mask4 = None
    if mask is not None:
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        mask4 = mask.expand(B, H, N, M)  # a view: no copy
    may_die = mask4 is not None or (causal and M < N)  # can a row end up with no key at all?
    out = q.new_empty(B * H, N, dv)  # (BH, N, d_v)
    zero = q.new_zeros(1, 1, 1)  # baddbmm's ignored addend (beta=0): lets the product carry the scale
    for i0 in range(0, N, q_block):
        i1 = min(i0 + q_block, N)
        qi = q3[:, i0:i1]  # (BH, qb, d_k), a view
        acc = q.new_zeros(B * H, i1 - i0, dv)  # unnormalised output rows
        m = q.new_full((B * H, i1 - i0, 1), float("-inf"))  # running max
        l = q.new_zeros(B * H, i1 - i0, 1)  # running sum of exp(s - m)
        j_stop = max(0, min(M, i1 + off)) if causal else M  # later keys are masked for every row here
        for j0 in range(0, j_stop, k_block):
            j1 = min(j0 + k_block, j_stop)
            s = torch.baddbmm(zero, qi, kt3[:, :, j0:j1], beta=0, alpha=sc)  # (BH, qb, kb): the only tile alive
            if mask4 is not None:
                apply_mask_(s, mask4[:, :, i0:i1, j0:j1].reshape(B * H, i1 - i0, j1 - j0))
            if causal and j1 - 1 > i0 + off:  # the tile crosses the diagonal
                cols = torch.arange(j0, j1, device=q.device)
                rows = torch.arange(i0, i1, device=q.device)
                s.masked_fill_(cols[None, :] > rows[:, None] + off, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            if may_die:  # rows with nothing to see so far: keep exp() finite
                m_new = m_new.masked_fill(m_new == float("-inf"), 0.0)
            s.sub_(m_new).exp_()  # p = exp(s - m_new), in place
            alpha = (m - m_new).exp_()  # how much the old max overstated: rescale the past
            l.mul_(alpha).add_(s.sum(dim=-1, keepdim=True))
            acc.mul_(alpha).baddbmm_(s, v3[:, j0:j1])  # acc must be contiguous: on a view this is a per-head loop
            m = m_new
            del s  # free this tile before the next one is made: one tile alive, not two
        if may_die:
            l.masked_fill_(l == 0, 1.0)  # a row that saw no key keeps its zero output
        torch.div(acc, l, out=out[:, i0:i1])
        del acc, m, l
    return out.view(B, H, N, dv)


# --- window: local attention in non-overlapping windows (Swin) -----------------------------


def _cat_pad(x: Tensor, dim: int, pad: int, value: float | bool) -> Tensor:
    """Pad x at the end of dim; works for bool tensors too (F.pad does not)."""
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype, device=x.device)], dim=dim)


def _mask_blocks(mask: Tensor, n_pad: int, w: int) -> Tensor:
    """Cut the diagonal (w × w) blocks out of a mask broadcastable to (B, H, N, N).

    Returns a mask broadcastable to (B, H, nw, w, w). Padded keys are masked; padded query rows
    are left open (their outputs are dropped).
    """
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    lead = mask.shape[:-2]
    Lq, Lk = mask.shape[-2:]
    shut = False if mask.dtype == torch.bool else float("-inf")
    open_ = True if mask.dtype == torch.bool else 0.0
    nw = (Lk + n_pad) // w if Lk > 1 else (Lq + n_pad) // w
    if Lk > 1:
        mask = _cat_pad(mask, -1, n_pad, shut)
    if Lq > 1:
        mask = _cat_pad(mask, -2, n_pad, open_)
    if Lq == 1 and Lk == 1:
        return mask.unsqueeze(-3)  # (..., 1, 1, 1)
    if Lq == 1:
        return mask.reshape(*lead, nw, 1, w)  # a key-padding mask, per window
    if Lk == 1:
        return mask.reshape(*lead, nw, w, 1)
    blocks = mask.reshape(*lead, nw, w, nw, w).diagonal(dim1=-4, dim2=-2)  # (..., w, w, nw)
    return blocks.movedim(-1, -3)  # (..., nw, w, w)


def _window_1d(q: Tensor, k: Tensor, v: Tensor, w: int, sc: float, causal: bool,
               mask: Tensor | None, key_valid: Tensor | None = None) -> Tensor:
    B, H, N, dk = q.shape
    dv = v.shape[-1]
    w = max(1, min(w, N))
    nw = -(-N // w)
    pad = nw * w - N
    qw = _cat_pad(q * sc, 2, pad, 0.0).view(B, H, nw, w, dk)  # (B, H, nw, w, d_k)
    kw = _cat_pad(k, 2, pad, 0.0).view(B, H, nw, w, dk)
    vw = _cat_pad(v, 2, pad, 0.0).view(B, H, nw, w, dv)
    s = qw @ kw.transpose(-1, -2)  # (B, H, nw, w, w): n·w scores instead of n²
    if pad:
        s[:, :, -1, :, w - pad:] = float("-inf")  # padding keys
    if key_valid is not None:
        s.masked_fill_(~key_valid.view(1, 1, nw, 1, w), float("-inf"))
    if mask is not None:
        apply_mask_(s, _mask_blocks(mask, pad, w))
    if causal:  # windows are contiguous runs, so global causal is causal inside each window
        s.masked_fill_(torch.ones(w, w, dtype=torch.bool, device=q.device).triu_(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    if mask is not None:  # a row that may see no key attends to nothing (softmax gave NaN)
        p.masked_fill_(torch.isneginf(s).all(dim=-1, keepdim=True), 0.0)
    return (p @ vw).view(B, H, nw * w, dv)[:, :, :N]  # (B, H, N, d_v)


def _window_order(grid: tuple[int, int], ws: int, device: torch.device) -> Tensor:
    """Token index for each slot of the window-major layout, -1 where a window hangs off the grid."""
    gh, gw = grid
    nh, nw = -(-gh // ws), -(-gw // ws)
    idx = torch.full((nh * ws, nw * ws), -1, dtype=torch.long, device=device)
    idx[:gh, :gw] = torch.arange(gh * gw, device=device).view(gh, gw)
    return idx.view(nh, ws, nw, ws).permute(0, 2, 1, 3).reshape(-1)  # (nh·nw·ws·ws,)


def window(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float | None = None,
           causal: bool = False, window: int = 128, grid: tuple[int, int] | None = None) -> Tensor:
    """Attention restricted to non-overlapping local windows (Swin-style partition).

    Text (grid None): token i sees the tokens of its run of ``window`` consecutive tokens.
    Image patches (grid=(rows, cols), N = rows·cols): a patch sees the patches of its
    ``window × window`` square. With window ≥ N (1D) or ≥ both grid sides (2D) this is exact.
    """
    if window < 1:
        raise ValueError(f"window must be positive, got {window}")
    if k.shape[-2] != q.shape[-2]:
        raise ValueError("window attention is self-attention: q and k need the same length")
    sc = attention_scale(q.shape[-1], scale=scale)
    if grid is None:
        return _window_1d(q, k, v, window, sc, causal, mask)
    gh, gw = grid
    N = q.shape[-2]
    if gh * gw != N:
        raise ValueError(f"grid {gh}×{gw} has {gh * gw} cells but the sequence has {N} tokens")
    if causal or mask is not None:
        raise ValueError("2D window attention takes no causal flag and no mask")
    order = _window_order((gh, gw), window, q.device)
    valid = order >= 0
    safe = order.clamp_min(0)
    out_w = _window_1d(q[:, :, safe], k[:, :, safe], v[:, :, safe], window * window, sc,
                       False, None, key_valid=valid)  # (B, H, L, d_v), window-major order
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    out[:, :, order[valid]] = out_w[:, :, valid]
    return out


# --- linear: kernelised attention ----------------------------------------------------------


_TINY = 1e-30  # normaliser floor: only a row whose keys are all masked gets near it


def _phi(x: Tensor) -> Tensor:
    """The feature map φ(x) = elu(x) + 1: positive, so the normaliser never changes sign."""
    return F.elu(x).add_(1.0)


def _key_keep(mask: Tensor | None) -> Tensor | None:
    """A key-padding mask as a bool (…, M, 1) column; linear attention can take no other mask."""
    if mask is None:
        return None
    if mask.dim() == 1:
        mask = mask.unsqueeze(0)
    if mask.dtype != torch.bool or mask.shape[-2] != 1:
        raise ValueError("linear attention takes only a bool key-padding mask shaped (…, 1, M)")
    return mask.transpose(-1, -2)  # (…, M, 1)


def linear(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float | None = None,
           causal: bool = False, chunk: int = 128) -> Tensor:
    """out_i = φ(q_i)·Σ_j φ(k_j) v_jᵀ / φ(q_i)·Σ_j φ(k_j), computed right-to-left in O(N·d²).

    There is no softmax, so there is no 1/√d_k temperature: ``scale`` (default 1) multiplies q
    before φ, as the paper's feature map has none. Causal runs chunk by chunk: a (chunk × chunk)
    masked block inside the chunk plus a running (d_k × d_v) state for everything before it.
    """
    sc = 1.0 if scale is None else float(scale)
    B, H, N, dk = q.shape
    if causal and k.shape[-2] != N:
        raise ValueError("causal linear attention is self-attention: q and k need the same length")
    fq = _phi(q * sc if sc != 1.0 else q)  # (B, H, N, d_k)
    fk = _phi(k)  # (B, H, M, d_k)
    keep = _key_keep(mask)
    if keep is not None:
        fk = fk * keep.to(fk.dtype)
    if not causal:
        kv = fk.transpose(-1, -2) @ v  # (B, H, d_k, d_v)
        z = fk.sum(dim=-2).unsqueeze(-1)  # (B, H, d_k, 1)
        return (fq @ kv).div_((fq @ z).clamp_min_(_TINY))  # a row with every key masked -> 0
    dv = v.shape[-1]
    out = q.new_empty(B, H, N, dv)
    state = q.new_zeros(B, H, dk, dv)  # Σ φ(k_j) v_jᵀ over earlier chunks
    zstate = q.new_zeros(B, H, dk, 1)  # Σ φ(k_j) over earlier chunks
    for c0 in range(0, N, chunk):
        c1 = min(c0 + chunk, N)
        fqc, fkc, vc = fq[:, :, c0:c1], fk[:, :, c0:c1], v[:, :, c0:c1]
        a = (fqc @ fkc.transpose(-1, -2)).tril_()  # (B, H, c, c)
        num = a @ vc + fqc @ state
        den = (a.sum(dim=-1, keepdim=True) + fqc @ zstate).clamp_min_(_TINY)
        out[:, :, c0:c1] = num.div_(den)
        state += fkc.transpose(-1, -2) @ vc
        zstate += fkc.sum(dim=-2).unsqueeze(-1)
    return out


def linear_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                     scale: float | None = None, causal: bool = False) -> Tensor:
    """The same linear attention written the O(N²) way: A = φ(q) φ(k)ᵀ, out = A v / A 1."""
    sc = 1.0 if scale is None else float(scale)
    a = _phi(q * sc) @ _phi(k).transpose(-1, -2)  # (B, H, N, M)
    keep = _key_keep(mask)
    if keep is not None:
        a = a * keep.transpose(-1, -2).to(a.dtype)
    if causal:
        a = a.tril()
    return (a @ v) / a.sum(dim=-1, keepdim=True).clamp_min(_TINY)


# --- sdpa: the library kernel --------------------------------------------------------------


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float | None = None,
         causal: bool = False) -> Tensor:
    """torch's fused kernel (flash / memory-efficient / math, chosen by torch), as core.attention calls it."""
    return fused_attention(q, k, v, mask=mask, scale=scale, causal=causal)


# name -> function; every one has the signature fn(q, k, v, mask=None, scale=None, causal=False, ...)
VARIANTS: dict[str, Callable[..., Tensor]] = {
    "naive": naive,
    "chunked": chunked,
    "window": window,
    "linear": linear,
    "sdpa": sdpa,
}

# Variants that give exact attention's answer (up to rounding); the others approximate it.
EXACT = frozenset({"naive", "chunked", "sdpa"})
