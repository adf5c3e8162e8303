"""Lazy, exact attention: keep each layer's q and k and each row's log-sum-exp, never the maps.

A probability is exp(logit_ij - lse_i), so any tile of any head's map (a window, a row, a column, a
pooled view) can be computed again exactly from q, k and lse, in O(tile) memory.

keep_attention is what MultiHeadAttention runs when its capture asks for "keep": the layer's output
and the rows' lse, computed in query blocks (no n×n buffer).
"""
from __future__ import annotations

import torch

from attn_explorer.core.attention import attention_scale, fold_mask


def _rep(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, H_kv, M, d) -> (B, H, M, d): grouped-query repetition (a view where H_kv = H)."""
    r = heads // t.shape[1]
    return t if r == 1 else t.repeat_interleave(r, dim=1)


def logits_block(q: torch.Tensor, k: torch.Tensor, opts, head_dim: int, rows: slice, n_total: int,
                 cols: slice | None = None) -> torch.Tensor:
    """The masked, scaled (and soft-capped) logits of query rows `rows` against keys `cols` (all keys
    when None): (B, H, r, c) float32. q (B, H, N, d), k (B, H, M, d) already repeated."""
    M = k.shape[-2]
    cols = slice(0, M) if cols is None else cols
    qb, kb = q[:, :, rows].float(), k[:, :, cols].float()
    s = torch.matmul(qb, kb.transpose(-2, -1)) * attention_scale(head_dim, opts.dk_scale, opts.scale)
    if opts.softcap is not None:
        s = torch.tanh(s / opts.softcap) * opts.softcap
    N = n_total
    if opts.causal:
        i = torch.arange(rows.start, rows.stop, device=q.device)[:, None] + (M - N)
        j = torch.arange(cols.start, cols.stop, device=q.device)[None, :]
        ok = j <= i
        if opts.window is not None:
            ok &= j > i - opts.window
        s = s.masked_fill(~ok, float("-inf"))
    if opts.mask is not None:
        m = opts.mask
        while m.dim() < 4:
            m = m.unsqueeze(0)
        m = m.expand(*m.shape[:2], N if m.shape[-2] != 1 else 1, M)[..., rows if m.shape[-2] != 1 else slice(None), cols]
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
    return s


def keep_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts, head_dim: int,
                   block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (B, H, N, d_v), lse (B, H, N) float32) of exact attention, in query blocks.
    k, v: (B, H_kv, M, d), before grouped-query repetition."""
    B, H, N, _ = q.shape
    kr, vr = _rep(k, H), _rep(v, H)
    out = q.new_empty(B, H, N, v.shape[-1])
    lse = torch.empty(B, H, N, dtype=torch.float32, device=q.device)
    for a in range(0, N, block):
        rows = slice(a, min(N, a + block))
        s = logits_block(q, kr, opts, head_dim, rows, N)
        l = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - l[..., None]).nan_to_num_(0.0)  # a row with no key: lse -inf, weights 0
        lse[:, :, rows] = l
        out[:, :, rows] = torch.matmul(p.to(v.dtype), vr)
    return out, lse
