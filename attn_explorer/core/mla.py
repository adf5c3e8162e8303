"""Multi-head latent attention (MLA), DeepSeek-V2/V3's attention: queries and keys rebuilt from small
latents, each head's key made of a no-position part of its own and one rotated part every head shares.

With D the model width, H heads, and MLAConfig's sizes (DeepSeek-V3: r_q = 1536, r = 512, d_nope = 128,
d_rope = 64, d_v = 128; d_qk = d_nope + d_rope = 192), for x (B, N, D):

    queries   c_q = query_norm(query_down(x))             (B, N, r_q)     [q_lora_rank None: no latent,
              q   = query_up(c_q), per head                (B, H, N, d_qk)  q = query(x) directly]
              q   = [q_nope (d_nope) | q_rope (d_rope)]
    keys and  [c_kv | k_rope] = kv_down(x)                 (B, N, r + d_rope)
    values    c_kv = kv_norm(c_kv)                         (B, N, r)       the latent: r numbers a token
              [k_nope | v] = kv_up(c_kv), per head         (B, H, N, d_nope + d_v)
              k_rope: ONE (B, 1, N, d_rope) for every head (multi-query style)
    positions RoPE on q_rope and k_rope only (rope_layout "pairs_in" for rope_interleave, else "half")
    joined    q = [q_nope | RoPE(q_rope)],  k = [k_nope | RoPE(k_rope)]   (B, H, N, d_qk) each
    maps      softmax(q · k^T · scale + mask), scale = d_qk^-1/2 times YaRN's mscale² where the rope
              scaling says so (MLAConfig.scale)                            (B, H, N, M): the real maps
    output    z = maps @ v (B, H, N, d_v)  ->  out(z as (B, N, H·d_v))     (B, N, D)

Hook points as MultiHeadAttention's (core.hooks): hook_q and hook_k (B, N, H, d_qk) are the joined q and k
(after RoPE), hook_v and hook_z (B, N, H, d_v); d_v may differ from d_qk. `head_dim` is d_v (each head's
slice of W_O, what hook_z holds), `qk_head_dim` is d_qk.

Lazy mode (core.lazy) keeps, instead of every head's k (H·d_qk numbers a token), the latent and the shared
k_rope (r + d_rope numbers a token) as `LatentKeys`, which rebuild any head's keys for a tile from the
up-projection's key rows: DeepSeek-V3's 128 heads keep 576 numbers a token instead of 24,576 (42.7x fewer).
The KV cache for generation (`LatentKV`, the model's new_cache) keeps the latent and k_rope too, as transformers
does (576 numbers a token and layer instead of every head's k and v, 40,960), until a hook may replace k or v.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from attn_explorer.core import lazy
from attn_explorer.core.attention import AttentionOptions, LayerKV, fused_attention, scaled_dot_product_attention
from attn_explorer.core.explain import half_grad
from attn_explorer.core.layers import RMSNorm
from attn_explorer.core.linear import Linear
from attn_explorer.core.masks import attention_scale, differentiable
from attn_explorer.core.positional import apply_rope


@dataclass(frozen=True)
class MLAConfig:
    """The sizes of one MLA layer, under transformers' DeepseekV3Config names in the comments."""

    kv_lora_rank: int  # r: the key/value latent's width
    qk_nope_head_dim: int  # d_nope: each head's q/k dimensions without positions
    qk_rope_head_dim: int  # d_rope: each head's rotated q/k dimensions (k's shared by every head)
    v_head_dim: int  # d_v
    q_lora_rank: int | None = None  # r_q: the query latent's width; None: one plain query projection
    bias: bool = False  # attention_bias: biases on query_down, kv_down and W_O (and on query when r_q is None: no)
    latent_eps: float = 1e-6  # the two latent RMSNorms' epsilon (transformers leaves them at 1e-6)
    scale: float | None = None  # the logits' factor; None: d_qk^-1/2 (YaRN: times mscale(factor, mscale_all_dim)²)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def latent_bytes(self, elem: int) -> int:
        """What lazy mode keeps of one token's keys in one layer: the latent and the shared k_rope."""
        return (self.kv_lora_rank + self.qk_rope_head_dim) * elem

    def per_head_key_bytes(self, heads: int, elem: int) -> int:
        """What every head's k of one token in one layer would take instead (H·d_qk)."""
        return heads * self.qk_head_dim * elem


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature factor 0.1·mscale·ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class LatentKeys:
    """Every head's keys of one MLA layer, kept as what they are made from: the latent (B, 1, M, r) and the
    shared rotated part k_rope (B, 1, M, d_rope), with the up-projection's key rows w_k (H, d_nope, r).

    It reads like the (B, H, M, d_qk) tensor of keys (`shape`, `dtype`, `device`, indexing), so core.lazy's
    tiles and analysis.long use it as they use k: an index computes only the heads and tokens asked for,
    k_h = [latent @ w_k[h]^T | k_rope]. numel() and element_size() count what it holds (the latent and
    k_rope; w_k is the model's own weight)."""

    def __init__(self, latent: torch.Tensor, k_rope: torch.Tensor, w_k: torch.Tensor):
        self.latent, self.k_rope, self.w_k = latent, k_rope, w_k

    @property
    def shape(self) -> torch.Size:
        B, _, M, _ = self.latent.shape
        return torch.Size((B, self.w_k.shape[0], M, self.w_k.shape[1] + self.k_rope.shape[-1]))

    @property
    def dtype(self) -> torch.dtype:
        return self.latent.dtype

    @property
    def device(self) -> torch.device:
        return self.latent.device

    def dim(self) -> int:
        return 4

    def numel(self) -> int:
        return self.latent.numel() + self.k_rope.numel()

    def element_size(self) -> int:
        return self.latent.element_size()

    def __getitem__(self, index) -> torch.Tensor:
        """The keys at [batch, head, token, dim] (ints or slices; fewer indices take the rest whole)."""
        if not isinstance(index, tuple):
            index = (index,)
        if len(index) > 4 or any(i is Ellipsis or i is None for i in index):
            raise IndexError("LatentKeys take up to 4 indices (batch, head, token, dim): ints or slices")
        index = index + (slice(None),) * (4 - len(index))
        spans = [_span(i, n) for i, n in zip(index, self.shape)]
        b, h, m, d = (s for s, _ in spans)
        lat = self.latent[b, 0, m]  # (b, m, r)
        w = self.w_k[h]  # (h, d_nope, r)
        nope = torch.matmul(lat[:, None], w.transpose(-1, -2))  # (b, h, m, d_nope)
        rope = self.k_rope[b, :, m].expand(-1, w.shape[0], -1, -1)  # (b, h, m, d_rope)
        k = torch.cat([nope, rope], dim=-1)[..., d]
        return k[tuple(0 if one else slice(None) for _, one in spans)]

    def full(self) -> torch.Tensor:
        """Every head's keys at once, (B, H, M, d_qk)."""
        return self[:, :, :, :]


def _span(i, size: int) -> tuple[slice, bool]:
    """An index as a slice, and whether it was one position (that axis is dropped after)."""
    if isinstance(i, slice):
        return i, False
    j = int(i)
    j = j + size if j < 0 else j
    if not 0 <= j < size:
        raise IndexError(f"index {int(i)} is out of range for size {size}")
    return slice(j, j + 1), True


class LatentKV(LayerKV):
    """One MLA layer's KV cache as transformers keeps it: the latent (B, 1, M, r) in `k` and the shared rotated
    key (B, 1, M, d_rope) in `v`, r + d_rope numbers a token (DeepSeek-V3: 576) instead of every head's k and v
    (H·(d_qk + d_v): 40,960); each forward rebuilds every head's k and v from it. A forward whose hooks may
    replace k or v turns it into every head's k and v for good (`expanded`), so a replacement stays in the
    cache as in MultiHeadAttention's."""

    def __init__(self):
        super().__init__()
        self.expanded = False

    def expand_(self, attn: "MultiHeadLatentAttention") -> None:
        """From latents to every head's k and v (the tokens cached so far)."""
        if not self.expanded and self.k is not None:
            self.k, self.v = attn.expand(self.k, self.v)
        self.expanded = True


_NO_OPTIONS = AttentionOptions()


class MultiHeadLatentAttention(nn.Module):
    """DeepSeek-V2/V3's attention (see the module docstring for the shapes). rope_layout: "pairs_in"
    (DeepSeek's rope_interleave) or "half". Honours AttentionOptions as MultiHeadAttention does: the mask,
    causal, window, dk_scale, need_weights, probs_out, the hooks and lazy keep, and the KV cache."""

    def __init__(self, dim: int, num_heads: int, cfg: MLAConfig, rope_layout: str = "pairs_in"):
        super().__init__()
        self.cfg, self.rope_layout = cfg, rope_layout
        self.num_heads = self.num_kv_heads = num_heads  # keys and values are per head once rebuilt
        self.head_dim = cfg.v_head_dim  # each head's output z and slice of W_O
        self.qk_head_dim = cfg.qk_head_dim
        H, d_qk = num_heads, cfg.qk_head_dim
        if cfg.q_lora_rank is None:
            self.query = Linear(dim, H * d_qk, bias=False)
        else:
            self.query_down = Linear(dim, cfg.q_lora_rank, bias=cfg.bias)
            self.query_norm = RMSNorm(cfg.q_lora_rank, cfg.latent_eps)
            self.query_up = Linear(cfg.q_lora_rank, H * d_qk, bias=False)
        self.kv_down = Linear(dim, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=cfg.bias)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg.latent_eps)
        self.kv_up = Linear(cfg.kv_lora_rank, H * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.out = Linear(H * cfg.v_head_dim, dim, bias=cfg.bias)  # W_O

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.q_lora_rank is None:
            return self.query(x)
        return self.query_up(self.query_norm(self.query_down(x)))

    def key_weights(self) -> torch.Tensor:
        """kv_up's rows that make each head's k_nope from the latent: (H, d_nope, r)."""
        c = self.cfg
        w = self.kv_up.weight.view(self.num_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
        return w[:, :c.qk_nope_head_dim]

    def latents(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, N, D) -> (q (B, H, N, d_qk), latent (B, 1, N, r), k_rope (B, 1, N, d_rope)), RoPE applied to q's
        rope part and k_rope with the (cos, sin) tables `rope` (None: no positions)."""
        c, H = self.cfg, self.num_heads
        B, N, _ = x.shape
        q = self._queries(x).view(B, N, H, c.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_rope = self.kv_down(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        latent = self.kv_norm(latent)[:, None]  # (B, 1, N, r)
        k_rope = k_rope[:, None]  # (B, 1, N, d_rope): one for every head
        if rope is not None:
            q_rope, k_rope = apply_rope(q_rope, rope, self.rope_layout), apply_rope(k_rope, rope, self.rope_layout)
        return torch.cat([q_nope, q_rope], dim=-1), latent, k_rope

    def expand(self, latent: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's k (B, H, M, d_qk) and v (B, H, M, d_v) from the latent (B, 1, M, r) and k_rope (B, 1, M, d_rope)."""
        c, H = self.cfg, self.num_heads
        B, _, M, _ = latent.shape
        kv = self.kv_up(latent[:, 0]).view(B, M, H, c.qk_nope_head_dim + c.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        return torch.cat([k_nope, k_rope.expand(-1, H, -1, -1)], dim=-1), v

    def project(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, ...]:
        """x (B, N, D) -> (q, k, v, latent, k_rope): `latents` and `expand` in one."""
        q, latent, k_rope = self.latents(x, rope)
        return (q, *self.expand(latent, k_rope), latent, k_rope)

    def forward(self, x: torch.Tensor, opts: AttentionOptions | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, N, D). Returns (output (B, N, D), probs (B, H, N, M) or None), as MultiHeadAttention."""
        o = _NO_OPTIONS if opts is None else opts
        if o.memory is not None:
            raise ValueError("multi-head latent attention is self-attention only (no cross-attention)")
        if getattr(o, "chunk", None) or getattr(o, "query_scale", None) is not None:  # Llama 4's, never DeepSeek's
            raise ValueError("multi-head latent attention has no attention chunks or per-query temperature")
        if o.scale is None and self.cfg.scale is not None:
            o = replace(o, scale=self.cfg.scale)
        B, N, _ = x.shape
        q, latent, k_rope = self.latents(x, o.rope)
        lh = o.hooks
        hooked_kv = lh is not None and (lh.wants("attn.hook_k") or lh.wants("attn.hook_v"))
        # a LatentKV cache keeps latents while no hook may replace k or v (then every head's k and v, for good)
        latent_cache = isinstance(o.kv, LatentKV) and not o.kv.expanded and not hooked_kv
        if latent_cache:
            latent, k_rope = o.kv.extend(latent, k_rope)  # every token's, cached ones first: (B, 1, M, ·)
        k, v = self.expand(latent, k_rope)
        if lh is not None:
            q, k, v = lh("attn.hook_q", q), lh("attn.hook_k", k), lh("attn.hook_v", v)
        # lazy keeps the latent where it still makes k: no per-head cache before it, no hook that replaced k
        latent_keys = lh is not None and lh.keep and (o.kv is None or latent_cache) and not hooked_kv
        if o.kv is not None and not latent_cache:
            if isinstance(o.kv, LatentKV):
                o.kv.expand_(self)
            k, v = o.kv.extend(k, v)  # (B, H, M, d)
        if lh is not None and lh.keep:
            keys = LatentKeys(latent, k_rope, self.key_weights().detach()) if latent_keys else k
            if latent_keys and not differentiable(latent):  # the keys as the tiles rebuild them (each row's lse
                k = keys.full()  # is theirs to the last bit); with autograd, the module's own (w_k is detached here)
            qkv = _same_width(q, k, v)
            ctx, lse = lazy.keep_attention(*qkv, o, self.qk_head_dim)
            lh.store(q, keys, lse, lazy.LayerOptions.of(o, self.qk_head_dim, rounded=lazy.rounded_logits(*qkv, o)))
            return self._finish(ctx[..., :self.head_dim], lh, B, N), None
        hook_pattern = lh is not None and lh.wants("attn.hook_pattern")
        if o.need_weights or hook_pattern or o.softcap is not None:
            ctx, probs = scaled_dot_product_attention(
                q, k, v, mask=o.mask, scale=o.scale, dk_scale=o.dk_scale, causal=o.causal,
                probs_out=o.probs_out, window=o.window, softcap=o.softcap,
            )
            if hook_pattern:  # the pattern after the hook weighs the values, as in MultiHeadAttention
                new = lh("attn.hook_pattern", probs)
                grad = differentiable(new, v)
                ctx = torch.matmul(half_grad(new), half_grad(v)) if grad else torch.matmul(new, v)
                if new is not probs:
                    probs = o.probs_out.copy_(new) if o.probs_out is not None and not differentiable(new) else new
            probs = probs if o.need_weights else None
        else:
            probs = None
            ctx = fused_attention(q, k, v, o.mask, attention_scale(self.qk_head_dim, o.dk_scale, o.scale), o.causal,
                                  o.window)
        return self._finish(ctx, lh, B, N), probs

    def _finish(self, ctx: torch.Tensor, lh, B: int, N: int) -> torch.Tensor:
        """ctx (B, H, N, d_v) -> (B, N, D) through W_O, after attn.hook_z."""
        if lh is not None:
            ctx = lh("attn.hook_z", ctx)
        return self.out(ctx.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim))


def _same_width(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v with one head width for torch's CPU flash kernel (which needs it): zeros appended to v (or to
    q and k) change no logit and no output; the caller keeps the output's first d_v columns."""
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if d_v < d_qk:
        v = torch.cat([v, v.new_zeros(*v.shape[:-1], d_qk - d_v)], dim=-1)
    elif d_qk < d_v:
        q = torch.cat([q, q.new_zeros(*q.shape[:-1], d_v - d_qk)], dim=-1)
        k = torch.cat([k, k.new_zeros(*k.shape[:-1], d_v - d_qk)], dim=-1)
    return q, k, v
