"""Attention, written out: softmax(Q K^T / sqrt(d_k)) V, and the multi-head module around it.

The explicit path always computes the probabilities and can hand them back; the fast path
(torch's fused scaled_dot_product_attention) is taken only when nobody asked for them.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.positional import apply_rope


def causal_mask(n: int, m: int | None = None, device=None) -> torch.Tensor:
    """Boolean (n, m) mask, True where query i may look at key j (j <= i + m - n)."""
    m = n if m is None else m
    return torch.ones(n, m, dtype=torch.bool, device=device).tril(diagonal=m - n)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    dk_scale: float = 1.0,
    causal: bool = False,
    probs_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention. q: (..., N, d_k), k: (..., M, d_k), v: (..., M, d_v).

    mask: boolean (True = may attend) or additive float, broadcastable to (..., N, M).
    scale defaults to 1/sqrt(d_k); dk_scale multiplies it (the GUI's d_k slider).
    Returns (output (..., N, d_v), probs (..., N, M)). A query row with every key masked gets
    all-zero weights and a zero output, never NaN.
    probs_out: a contiguous (..., N, M) buffer to compute the probabilities in, in place: the
    model's stacked attention tensor, so no n×n buffer is allocated or copied per layer.
    """
    d_k = q.shape[-1]
    scale = (1.0 / math.sqrt(d_k) if scale is None else scale) * dk_scale
    if probs_out is None:
        logits = torch.matmul(q, k.transpose(-2, -1)) * scale  # (..., N, M)
    else:
        logits = torch.matmul(q, k.transpose(-2, -1), out=probs_out).mul_(scale)
    if causal:
        logits = logits.masked_fill_(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            logits = logits.masked_fill_(~mask, float("-inf"))
        else:
            logits = logits.add_(mask)
    # exp(-inf - (-inf)) is NaN: a row with nothing to look at must attend to nothing. A causal
    # mask alone empties rows only when there are fewer keys than queries.
    may_empty = mask is not None or (causal and k.shape[-2] < q.shape[-2])
    dead = torch.isneginf(logits).all(dim=-1, keepdim=True) if may_empty else None
    probs = torch.softmax(logits, dim=-1, out=logits)  # in place: logits are not needed afterwards
    if dead is not None and dead.any():
        probs = probs.masked_fill_(dead, 0.0)
    return torch.matmul(probs, v), probs


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with the W_O output projection.

    fused_qkv=True keeps one (dim -> 3*dim) projection called `qkv` (GPT-2, timm); otherwise three
    projections `query`, `key`, `value` (BERT, ViT). num_kv_heads < num_heads gives grouped-query
    attention: each key/value head serves num_heads // num_kv_heads query heads.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        out_bias: bool = True,
        fused_qkv: bool = False,
        head_dim: int | None = None,
        num_kv_heads: int | None = None,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if head_dim is None and dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}")
        self.head_dim = head_dim or dim // num_heads
        self.fused_qkv = fused_qkv
        q_out, kv_out = num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if fused_qkv:
            self.qkv = nn.Linear(dim, q_out + 2 * kv_out, bias=qkv_bias)
        else:
            self.query = nn.Linear(dim, q_out, bias=qkv_bias)
            self.key = nn.Linear(dim, kv_out, bias=qkv_bias)
            self.value = nn.Linear(dim, kv_out, bias=qkv_bias)
        self.out = nn.Linear(q_out, dim, bias=out_bias)  # W_O

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        B, N, _ = x.shape
        return x.view(B, N, heads, self.head_dim).transpose(1, 2)  # (B, H, N, d_k)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        dk_scale: float = 1.0,
        need_weights: bool = False,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        capture: dict | None = None,
        probs_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, N, D). Returns (output (B, N, D), probs (B, H, N, N) or None).

        capture: if a dict is given, the per-head values (B, H, N, d_k) and per-head outputs
        (B, H, N, D: each head's share of the result after W_O) are stored in it, for analyses.
        """
        B, N, _ = x.shape
        if self.fused_qkv:
            q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            q, k, v = self.qkv(x).split([q_out, kv_out, kv_out], dim=-1)
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)
        q = self._split(q, self.num_heads)  # (B, H, N, d_k)
        k = self._split(k, self.num_kv_heads)  # (B, H_kv, N, d_k)
        v = self._split(v, self.num_kv_heads)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        if self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if need_weights or capture is not None:
            ctx, probs = scaled_dot_product_attention(
                q, k, v, mask=mask, dk_scale=dk_scale, causal=causal, probs_out=probs_out
            )
        else:
            probs = None
            sdpa_mask = mask
            if causal and mask is not None:
                cm = causal_mask(N, N, x.device)
                sdpa_mask = (mask & cm) if mask.dtype == torch.bool else mask.masked_fill(~cm, float("-inf"))
            ctx = F.scaled_dot_product_attention(
                q, k, v, attn_mask=sdpa_mask, is_causal=causal and mask is None,
                scale=dk_scale / math.sqrt(self.head_dim),
            )
        if capture is not None:
            capture["values"] = v
            w_o = self.out.weight.view(self.out.out_features, self.num_heads, self.head_dim)  # (D, H, d_k)
            capture["head_outputs"] = torch.einsum("bhnd,ehd->bhne", ctx, w_o)  # (B, H, N, D)
        out = ctx.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim)  # (B, N, H*d_k)
        return self.out(out), probs
