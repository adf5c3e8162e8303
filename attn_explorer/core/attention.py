"""Attention, written out: softmax(Q K^T / sqrt(d_k)) V, and the multi-head module around it.

The explicit path always computes the probabilities and can hand them back; the fast path
(torch's fused scaled_dot_product_attention) is taken only when nobody asked for them.
The scale and the mask are each worked out in one function here, which core.efficient uses too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.explain import half_grad
from attn_explorer.core.hooks import LayerHooks
from attn_explorer.core import lazy
from attn_explorer.core.layers import unit_rms
from attn_explorer.core.linear import Linear, PackedLinears
from attn_explorer.core.masks import (apply_mask_, attention_scale, causal_mask, differentiable,  # noqa: F401 (re-exported)
                                     fold_mask, key_padding_mask)
from attn_explorer.core.positional import apply_rope
from attn_explorer.core.sinks import fold_sink, softmax_with_sink


class LayerKV:
    """One layer's keys and values of the tokens seen so far, (B, H_kv, n, d_k) each (after RoPE, before
    grouped-query repetition), so each new token computes only its own k and v."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens' k and v; returns every token's k and v."""
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)
        self.k, self.v = k, v
        return k, v

    def truncate(self, n: int) -> None:
        """Keep the first n tokens' keys and values only (an edit of the input from token n on)."""
        if self.k is not None:
            self.k, self.v = self.k[..., :n, :], self.v[..., :n, :]


class KVCache:
    """Every layer's LayerKV: what a decoder keeps between generation steps."""

    def __init__(self, num_layers: int):
        self.layers = [LayerKV() for _ in range(num_layers)]

    @property
    def length(self) -> int:
        """Tokens already in the cache (the position of the next one)."""
        return self.layers[0].length

    def truncate(self, n: int) -> None:
        """Every layer keeps its first n tokens (prefix reuse: the tokens before the first edited one)."""
        for layer in self.layers:
            layer.truncate(n)


def decoder_start(cache: KVCache | None, n_new: int, max_positions: int) -> int:
    """The position of the first of n_new tokens (after the cached ones); refuses a sequence longer than
    the model's positions."""
    past = 0 if cache is None else cache.length
    if past + n_new > max_positions:
        raise ValueError(f"{past + n_new} positions; the model has {max_positions}")
    return past


@dataclass
class AttentionOptions:
    """What an attention layer needs besides its input; travels down the stack as one argument."""

    mask: torch.Tensor | None = None  # bool (True = may attend) or additive float, broadcastable to (B, H, N, M)
    causal: bool = False  # query i sees only keys j <= i + M - N
    dk_scale: float = 1.0  # multiplies 1/sqrt(d_k) (the GUI's d_k slider)
    need_weights: bool = False  # return the probabilities (forces the explicit path)
    rope: tuple[torch.Tensor, torch.Tensor] | None = None  # (cos, sin) from positional.rope_tables
    hooks: LayerHooks | None = None  # this block's named hook points and lazy keep (core.hooks)
    probs_out: torch.Tensor | None = None  # contiguous (B, H, N, M) buffer to compute the probabilities in
    kv: LayerKV | None = None  # past keys and values: the N new tokens attend to M = past + N keys
    memory: torch.Tensor | None = None  # cross-attention: keys and values from these (B, M, D) tokens (the encoder's output)
    window: int | None = None  # sliding window (local layers): query i sees only its last `window` keys, itself included
    scale: float | None = None  # the logits' factor before dk_scale; None: 1/sqrt(d_k) (Gemma: query_pre_attn_scalar^-1/2)
    softcap: float | None = None  # logits -> softcap * tanh(logits / softcap) before the mask (Gemma 2)
    # Llama 4:
    chunk: int | None = None  # attention chunks (attention_chunk_size): a query sees only its own chunk's keys
    query_scale: torch.Tensor | None = None  # (N,) each new query's factor after RoPE (temperature tuning)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    dk_scale: float = 1.0,
    causal: bool = False,
    probs_out: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention. q: (..., N, d_k), k: (..., M, d_k), v: (..., M, d_v).

    mask: boolean (True = may attend) or additive float, broadcastable to (..., N, M).
    scale defaults to 1/sqrt(d_k); dk_scale multiplies it (the GUI's d_k slider).
    Returns (output (..., N, d_v), probs (..., N, M)). A query row with every key masked gets
    all-zero weights and a zero output, never NaN.
    probs_out: a contiguous (..., N, M) buffer to compute the probabilities in, in place: the
    model's stacked attention tensor, so no n×n buffer is allocated or copied per layer.
    window: a causal sliding window, chunk: attention chunks (see causal_mask). softcap: the scaled logits become
    softcap * tanh(logits / softcap) before the mask (Gemma 2); the probabilities stay exact.
    sinks (gpt-oss): one learned logit per head (H,), q's dim -3, joins each row's softmax as a column
    with no value (core.sinks): the probabilities over the M keys then sum to 1 - the sink's share.
    """
    N, M = q.shape[-2], k.shape[-2]
    s = attention_scale(q.shape[-1], dk_scale, scale)
    # Scale whichever is smaller, q (N·d_k) or the logits (N·M), but q only where that rounds as transformers'
    # order (logits, then scale) does: a power of two (d_k = 16, 64, 256) is exact either way; 1/sqrt(8) is not
    # (Phi-3's partial-rotary test drifted 1e-5 from transformers by it).
    exact = isinstance(s, (int, float)) and math.frexp(s)[0] == 0.5  # a tensor d_k scale (autograd): the logits
    scale_q = q.shape[-1] < M and softcap is None and exact
    if scale_q and s != 1.0:
        q = q * s
    if differentiable(q, k, v):  # half_grad: AttnLRP's uniform rule inside core.explain.lrp_rules, else nothing
        logits = torch.matmul(half_grad(q), half_grad(k).transpose(-2, -1))
        if not scale_q and s != 1.0:
            logits = logits * s
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        full = fold_mask(mask, causal, N, M, q.device, window, chunk)
        if full is not None:
            logits = logits.masked_fill(~full, float("-inf")) if full.dtype == torch.bool else logits + full
    else:
        logits = torch.matmul(q, k.transpose(-2, -1), out=probs_out)  # (..., N, M)
        if not scale_q and s != 1.0:
            logits.mul_(s)
        if softcap is not None:  # in transformers' order: (logits / c), tanh, * c
            logits.div_(softcap).tanh_().mul_(softcap)
        full = fold_mask(mask, causal, N, M, q.device, window, chunk)
        if full is not None:
            apply_mask_(logits, full)
    if sinks is not None:  # gpt-oss: the sink's column in the softmax; a row may always look at the sink
        probs = softmax_with_sink(logits, sinks, inplace=not differentiable(q, k, v))
        grad = differentiable(q, k, v)
        return (torch.matmul(half_grad(probs), half_grad(v)) if grad else torch.matmul(probs, v)), probs
    # exp(-inf - (-inf)) is NaN: a row with nothing to look at must attend to nothing. A causal
    # mask alone empties rows only when there are fewer keys than queries.
    may_empty = mask is not None or (causal and M < N)
    dead = torch.isneginf(logits).all(dim=-1, keepdim=True) if may_empty else None
    if differentiable(q, k, v):  # autograd asked for: no in-place step, so gradients reach the probabilities
        probs = torch.softmax(logits, dim=-1)
        if dead is not None and dead.any():
            probs = probs.masked_fill(dead, 0.0)
        return torch.matmul(half_grad(probs), half_grad(v)), probs
    probs = torch.softmax(logits, dim=-1, out=logits)  # in place: logits are not needed afterwards
    if dead is not None and dead.any():
        probs = probs.masked_fill_(dead, 0.0)
    return torch.matmul(probs, v), probs


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    causal: bool = False,
    window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """torch's fused kernel (flash / memory-efficient / math, chosen by torch): the output only."""
    N, M = q.shape[-2], k.shape[-2]
    if causal and (mask is not None or N != M or window is not None or chunk is not None):
        # SDPA refuses a mask with is_causal, and aligns is_causal top-left: fold ours in instead
        mask, causal = fold_mask(mask, True, N, M, q.device, window, chunk), False
    # grouped-query k, v (fewer heads than q) are read by the kernel itself (enable_gqa): no repeated copies
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                          enable_gqa=q.dim() >= 3 and k.shape[-3] != q.shape[-3])


_NO_OPTIONS = AttentionOptions()


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with the W_O output projection.

    fused_qkv=True keeps one (dim -> 3*dim) projection called `qkv` (GPT-2, timm); otherwise three
    projections `query`, `key`, `value` (BERT, ViT), which still run as one product on the CPU
    fast path (core.linear). num_kv_heads < num_heads gives grouped-query attention: query head h
    uses key/value head h // (num_heads // num_kv_heads). qk_norm (a module factory, e.g. an RMSNorm
    over d_k) normalises each head's q and k before RoPE (Gemma 3's q_norm and k_norm). sinks=True
    (gpt-oss) gives each head a learned sink logit `sinks` (H,) that joins its softmax (core.sinks).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        out_bias: bool = True,
        fused_qkv: bool = False,
        qkv_layout: str = "stacked",
        head_dim: int | None = None,
        num_kv_heads: int | None = None,
        qk_norm=None,
        rope_layout: str = "half",
        qk_rms_after_rope: float | None = None,
        sinks: bool = False,
        rope_float32: bool = False,
        output_gate: bool = False,
    ):
        super().__init__()
        # Qwen3.5 / Qwen3-Next: q_proj gives each head its q and then a gate as wide (per head: [q_h, gate_h]);
        # the head's output is times sigmoid(gate) before W_O (and before hook_z: z is what W_O reads)
        self.output_gate = output_gate
        self.rope_float32 = rope_float32  # Cohere: q and k turned in float32 (cos, sin as given), then cast back
        self.rope_layout = rope_layout  # which dimensions RoPE pairs (positional.apply_rope)
        self.qk_rms_after_rope = qk_rms_after_rope  # Llama 4: q and k over their RMS, no weight, after RoPE (eps)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if head_dim is None and dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}")
        self.head_dim = head_dim or dim // num_heads
        self.fused_qkv = fused_qkv
        # a fused qkv's rows: "stacked" (every head's q, then k, then v: GPT-2, Phi-3) or "per_head"
        # (head 0's q, k, v, then head 1's...: GPT-NeoX's query_key_value)
        if qkv_layout not in ("stacked", "per_head"):
            raise ValueError(f"unknown qkv_layout {qkv_layout!r}: use 'stacked' or 'per_head'")
        if qkv_layout == "per_head" and self.num_kv_heads != num_heads:
            raise ValueError("a per-head fused qkv needs as many key/value heads as query heads")
        self.qkv_layout = qkv_layout
        q_out, kv_out = num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_sizes = [q_out * (2 if output_gate else 1), kv_out, kv_out]
        if fused_qkv:
            self.qkv = Linear(dim, sum(self.qkv_sizes), bias=qkv_bias)
        else:
            self.query = Linear(dim, self.qkv_sizes[0], bias=qkv_bias)
            self.key = Linear(dim, kv_out, bias=qkv_bias)
            self.value = Linear(dim, kv_out, bias=qkv_bias)
            self.packed_qkv = PackedLinears((self.query, self.key, self.value))
        self.out = Linear(q_out, dim, bias=out_bias)  # W_O
        if qk_norm is not None:
            self.q_norm, self.k_norm = qk_norm(self.head_dim), qk_norm(self.head_dim)
        else:
            self.q_norm = self.k_norm = None
        # gpt-oss: one learned sink logit per query head (core.sinks), or None
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None

    def _apply(self, fn, recurse=True):
        if not self.fused_qkv:
            self.packed_qkv.clear()  # the cache describes the tensors before .to()
        return super()._apply(fn, recurse)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.fused_qkv:
            qkv = self.qkv(x)
            if self.qkv_layout == "per_head":
                B, N, _ = qkv.shape
                parts = qkv.view(B, N, self.num_heads, 3, self.head_dim).unbind(3)  # (B, N, H, d_k) each
                return tuple(t.reshape(B, N, self.num_heads * self.head_dim) for t in parts)
            return qkv.split(self.qkv_sizes, dim=-1)
        qkv = self.packed_qkv(x)
        if qkv is None:
            return self.query(x), self.key(x), self.value(x)
        return qkv

    def _project_cross(self, x: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Cross-attention: the queries from x (the decoder's tokens), keys and values from memory."""
        if self.fused_qkv:
            raise ValueError("cross-attention needs separate query, key and value projections")
        return self.query(x), self.key(memory), self.value(memory)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        B, N, _ = x.shape
        return x.view(B, N, heads, self.head_dim).transpose(1, 2)  # (B, H, N, d_k)

    def _qkv(self, x: torch.Tensor, o: AttentionOptions) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, N, d_k), k and v (B, H_kv, M, d_k): projected, normalised, rotated, hooked (hook_q, hook_k,
        hook_v) and joined to the cache (opts.kv). A subclass with other projections overrides this (Gemma 4)."""
        q, k, v = self._project(x) if o.memory is None else self._project_cross(x, o.memory)
        if self.output_gate:  # per head [q_h, gate_h]: the gate waits for _finish
            B, N, _ = q.shape
            q, gate = q.reshape(B, N, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
            # sigmoid(gate) on a contiguous (B, N, H·d_k) copy, as transformers takes it (the same rounding)
            sig = torch.sigmoid(gate.reshape(B, N, -1))
            q, self._gate = q.reshape(B, N, -1), sig.view(B, N, self.num_heads, -1).transpose(1, 2)  # (B, H, N, d_k)
        q = self._split(q, self.num_heads)  # (B, H, N, d_k)
        k = self._split(k, self.num_kv_heads)  # (B, H_kv, N, d_k)
        v = self._split(v, self.num_kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if o.rope is not None and self.rope_float32 and q.dtype != torch.float32:  # as transformers' Cohere
            q, k = (apply_rope(t.float(), o.rope, self.rope_layout).to(t.dtype) for t in (q, k))
        elif o.rope is not None:
            q, k = apply_rope(q, o.rope, self.rope_layout), apply_rope(k, o.rope, self.rope_layout)
        if self.qk_rms_after_rope is not None:  # Llama 4's use_qk_norm (an L2Norm in transformers, an RMS in fact)
            q, k = unit_rms(q, self.qk_rms_after_rope), unit_rms(k, self.qk_rms_after_rope)
        if o.query_scale is not None:  # Llama 4's temperature tuning of its NoPE layers' queries
            q = (q * o.query_scale[:, None]).to(q.dtype)
        lh = o.hooks
        if lh is not None:
            q, k, v = lh("attn.hook_q", q), lh("attn.hook_k", k), lh("attn.hook_v", v)
        if o.kv is not None:
            k, v = o.kv.extend(k, v)  # (B, H_kv, M, d_k)
        return q, k, v

    def forward(
        self, x: torch.Tensor, opts: AttentionOptions | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, N, D). Returns (output (B, N, D), probs (B, H, N, M) or None); M = N without a cache,
        past + N with one (opts.kv).

        opts.hooks (core.hooks.LayerHooks): this block's attn.hook_q, hook_k, hook_v (after QK-norm and RoPE,
        before the cache and grouped-query repetition), attn.hook_pattern (asking for it forces the explicit
        path; a replacement is what the values are weighted with) and attn.hook_z (every head's output before
        W_O). With hooks.keep (lazy attention, core.lazy) the layer keeps only q (B, H, N, d_k), k (B, H_kv, M,
        d_k), each row's log-sum-exp of its masked logits (B, H, N) and its lazy.LayerOptions, and returns no
        maps.
        """
        o = _NO_OPTIONS if opts is None else opts
        B, N, _ = x.shape
        q, k, v = self._qkv(x, o)
        lh = o.hooks
        if lh is not None and lh.keep:
            ctx, lse = lazy.keep_attention(q, k, v, o, self.head_dim)
            if self.sinks is not None:  # the lse includes the sink, so tiles give the probabilities beside it
                ctx, lse = fold_sink(ctx, lse, self.sinks)
            # how tiles recompute this layer's logits
            lh.store(q, k, lse, lazy.LayerOptions.of(o, self.head_dim, sinks=self.sinks,
                                                     rounded=lazy.rounded_logits(q, k, v, o)))
            return self._finish(ctx, lh, B, N), None
        hook_pattern = lh is not None and lh.wants("attn.hook_pattern")
        explicit = o.need_weights or hook_pattern or o.softcap is not None  # torch's fused kernel cannot soft-cap
        if explicit and self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, H, M, d_k)
        if explicit:
            ctx, probs = scaled_dot_product_attention(
                q, k, v, mask=o.mask, scale=o.scale, dk_scale=o.dk_scale, causal=o.causal,
                probs_out=o.probs_out, window=o.window, softcap=o.softcap, sinks=self.sinks, chunk=o.chunk,
            )
            if hook_pattern:  # the pattern after the hook (changed in place or replaced) weighs the values
                new = lh("attn.hook_pattern", probs)
                grad = differentiable(new, v)  # AttnLRP's uniform rule on A·V, as the explicit path applies it
                ctx = torch.matmul(half_grad(new), half_grad(v)) if grad else torch.matmul(new, v)
                if new is not probs:  # and is the one returned
                    probs = o.probs_out.copy_(new) if o.probs_out is not None and not differentiable(new) else new
            probs = probs if o.need_weights else None
        elif self.sinks is not None:
            # torch's fused kernel has no sink column: core.lazy's kernel call (torch's flash kernel on the CPU,
            # blocked elsewhere) hands back each row's lse with the output, and the sink is folded in exactly
            probs = None
            ctx = fold_sink(*lazy.keep_attention(q, k, v, o, self.head_dim), self.sinks)[0]
        elif (o.window is not None or o.chunk is not None) and o.causal and q.device.type == "cpu" \
                and not differentiable(q, k, v):
            # issue 24 A: a window's (or chunk's) query blocks against their own key band, as the lazy forward
            # runs them, not one call over a folded n×n mask (Gemma 3 at 4,096 tokens: 3× less kernel time)
            probs = None
            ctx = lazy.keep_attention(q, k, v, o, self.head_dim)[0]
        else:
            probs = None
            ctx = fused_attention(q, k, v, o.mask, attention_scale(self.head_dim, o.dk_scale, o.scale), o.causal,
                                  o.window, o.chunk)
        return self._finish(ctx, lh, B, N), probs

    def _finish(self, ctx: torch.Tensor, lh: LayerHooks | None, B: int, N: int) -> torch.Tensor:
        """ctx (B, H, N, d_v), every head's output -> the layer's output (B, N, D) through W_O, after the
        block's attn.hook_z (if any); with output_gate, times sigmoid(gate) first (z is what W_O reads)."""
        if self.output_gate:
            ctx, self._gate = ctx * self._gate, None
        if lh is not None:
            ctx = lh("attn.hook_z", ctx)
        out = ctx.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim)  # (B, N, H*d_k)
        return self.out(out)
