"""Gemma 4's text model (Gemma4ForCausalLM, and the language model inside Gemma4ForConditionalGeneration).

The Gemma 3 decoder (sandwich norms, GeGLU, scaled embeddings, q/k norms, local and global layers) with
these differences, each a field of Gemma4Config or a part below:
- plain RMSNorms (x · w, not Gemma 3's x · (1 + w)); the values are normalised too, by an RMSNorm with no
  weight (v_norm); the attention logits are not scaled at all (scale 1: the q/k norms set their size);
- global layers have their own d_k (global_head_dim) and, with attention_k_eq_v, their own number of
  key/value heads (num_global_key_value_heads) and no value projection: a head's values are its keys'
  projection, normalised by v_norm instead of k_norm and never rotated;
- RoPE per layer type: local layers rotate all of d_k (base 10 000 by default), global layers use
  "proportional" RoPE over their wider d_k (only the first partial_rotary_factor of the frequencies turn);
- KV sharing: the last num_kv_shared_layers layers make no keys or values; each reads those of the last
  earlier layer of its own type (kv_source), and with use_double_wide_mlp has an MLP twice as wide;
- per-layer inputs (PLE): a second embedding table gives each layer a small vector per token
  (hidden_size_per_layer_input wide), mixed with a projection of the token embedding; each layer gates it
  with its stream and adds it back through its own projection and norm, a third branch after the MLP;
- a learned scalar per layer (layer_scalar) multiplies the block's output;
- no attention soft-cap; the final soft-cap as Gemma 2's.
- MoE (enable_moe_block, 26B-A4B): beside the dense MLP, every layer routes each token to k experts
  (Gemma4MoE); the two branches, each normalised, are summed before the post-MLP norm.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.attention import AttentionOptions, KVCache, LayerKV, MultiHeadAttention, decoder_start, \
    key_padding_mask
from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock, _no_hook
from attn_explorer.core.explain import act_rule, half_grad, norm_scale
from attn_explorer.core.hooks import Hooks
from attn_explorer.core.layers import RMSNorm, activation
from attn_explorer.core.linear import Linear, PackedLinears
from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.moe import MoE, MoEConfig
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.positional import apply_rope, rope_tables


_SHARED_KV = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.(?:k_proj|v_proj|k_norm|v_norm)\.")


@dataclass
class Gemma4Config(LlamaConfig):
    """LlamaConfig's Gemma fields (norm "rms", act "gelu_tanh", sandwich_norms, scale_embeddings, qk_norm,
    attn_scale 1.0, final_softcap, sliding_windows, rope_local_theta / rope_local_scaling) and Gemma 4's own.
    head_size is the local layers' d_k; rope_scaling is the global layers' (proportional by default)."""

    local_layers: list | None = None  # per layer, True: a sliding_attention layer (its own d_k and RoPE)
    global_head_dim: int | None = None  # d_k of the global layers (global_head_dim); None: head_size
    global_kv_heads: int | None = None  # key/value heads of the global layers; None: num_kv_heads
    k_eq_v: bool = False  # attention_k_eq_v: the global layers' values are their keys' projection
    kv_source: list | None = None  # per layer: the earlier layer whose keys and values it reads, or None
    wide_mlp: bool = False  # use_double_wide_mlp: the KV-sharing layers' MLPs are twice as wide
    per_layer_dim: int | None = None  # hidden_size_per_layer_input (None: no per-layer inputs)
    per_layer_vocab: int | None = None  # vocab_size_per_layer_input
    # the multimodal model (model_type gemma4) embeds its image/video/audio placeholder tokens as padding
    placeholder_ids: list | None = None  # image_token_id, video_token_id, audio_token_id
    placeholder_pad: int | None = None  # text_config's pad_token_id

    def is_local(self, layer: int) -> bool:
        return bool(self.local_layers and self.local_layers[layer])

    def layer_head_dim(self, layer: int) -> int:
        return self.head_dim if self.is_local(layer) else (self.global_head_dim or self.head_dim)

    def rope_dim(self, local: bool) -> int:
        """The width of the RoPE tables of the local or the global layers (all of their d_k)."""
        return self.head_dim if local else (self.global_head_dim or self.head_dim)

    def shared(self, layer: int) -> bool:
        return bool(self.kv_source) and self.kv_source[layer] is not None

    def unread(self, key: str) -> bool:
        """Whether a checkpoint tensor is one transformers never reads: a KV-sharing layer's own k_proj, v_proj,
        k_norm or v_norm (google/gemma-4-E2B still stores them)."""
        m = _SHARED_KV.search(key)
        return m is not None and self.shared(int(m.group(1)))

    def block(self, layer: int) -> BlockConfig:
        local = self.is_local(layer)
        wide = 2 if self.wide_mlp and self.shared(layer) else 1
        return replace(super().block(layer), head_dim=self.layer_head_dim(layer), mlp_hidden=self.mlp_hidden * wide,
                       moe=None,  # the dense MLP stays; Gemma4Block adds the experts beside it (cfg.moe)
                       num_kv_heads=self.num_kv_heads if local else (self.global_kv_heads or self.num_kv_heads))

    def layer_kinds(self) -> list[str]:
        """"local, window 512" / "global", with ", keys and values of layer j" on a KV-sharing layer."""
        kinds = super().layer_kinds()
        return [k + (f", keys and values of layer {self.kv_source[i]}" if self.shared(i) else "")
                for i, k in enumerate(kinds)]


@dataclass
class Gemma4Options(AttentionOptions):
    """AttentionOptions with the block's per-layer input (B, N, per_layer_dim), set per layer."""

    layer_input: torch.Tensor | None = None


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) in float32, the root as transformers' Gemma 4 takes it (pow(-0.5))."""
    y = x.float()
    return y * norm_scale(torch.pow(y.pow(2).mean(-1, keepdim=True) + eps, -0.5))


class Gemma4RMSNorm(RMSNorm):
    """RMSNorm as Gemma 4 computes it: the weight applied in float32, then the cast back (Llama's RMSNorm
    casts first; the same in float32, not in bfloat16)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (_rms(x, self.eps) * self.weight.float()).to(x.dtype)


class UnitRMSNorm(nn.Module):
    """The same with no weight (Gemma 4's v_norm and the router's norm)."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x, self.eps).to(x.dtype)


class Gemma4Router(nn.Module):
    """x (T, D) -> (indices (T, k), weights (T, k)): a softmax over the experts of proj(rms(x) · scale / sqrt(D)),
    its top k renormalised, each times its expert's per_expert_scale."""

    def __init__(self, dim: int, cfg: MoEConfig, eps: float):
        super().__init__()
        self.cfg, self.norm = cfg, UnitRMSNorm(eps)
        self.proj = Linear(dim, cfg.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(dim))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(self.proj(self.norm(x) * self.scale * x.shape[-1] ** -0.5), dim=-1, dtype=torch.float32)
        weights, indices = probs.topk(self.cfg.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return indices, (weights * self.per_expert_scale[indices]).to(x.dtype)


class Gemma4Experts(nn.Module):
    """Every expert's gate/up (E, 2I, D) and down (E, D, I) in the checkpoint's (out, in) layout."""

    def __init__(self, dim: int, cfg: MoEConfig):
        super().__init__()
        self.gate_up = nn.Parameter(torch.zeros(cfg.num_experts, 2 * cfg.hidden, dim))
        self.down = nn.Parameter(torch.zeros(cfg.num_experts, dim, cfg.hidden))


class Gemma4MoE(MoE):
    """core.moe.MoE's routing, hooks (mlp.hook_expert_indices / _weights) and weighted sum, with Gemma 4's
    router (on the stream as it is) and experts (on the stream after their own norm, norm_in; GeGLU with the
    model's activation). The block normalises the sum (norm_out) and adds it to the dense MLP's."""

    def __init__(self, dim: int, cfg: MoEConfig, eps: float, act: str):
        nn.Module.__init__(self)
        self.cfg, self.shared = cfg, None
        self.router = Gemma4Router(dim, cfg, eps)
        self.experts = Gemma4Experts(dim, cfg)
        # pre_feedforward_layernorm_2 and post_feedforward_layernorm_2
        self.norm_in, self.norm_out = Gemma4RMSNorm(dim, eps=eps), Gemma4RMSNorm(dim, eps=eps)
        self.act = activation(act)

    def expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(self.norm_in(h), self.experts.gate_up[e]).chunk(2, dim=-1)  # norm_in: per token
        return F.linear(half_grad(act_rule(self.act, gate)) * half_grad(up), self.experts.down[e])


class Gemma4Attention(MultiHeadAttention):
    """Gemma 4's attention: q, k RMSNorms with weights and v's without; k_eq_v: no `value` projection (the
    values are `key`'s output); shared (a KV-sharing layer): no key or value projection, its keys and values
    are opts.kv's (the cache slot of the layer it reads, which that layer filled)."""

    def __init__(self, c: BlockConfig, k_eq_v: bool = False, shared: bool = False):
        super().__init__(c.dim, c.num_heads, qkv_bias=c.qkv_bias, out_bias=c.attn_out_bias, head_dim=c.head_dim,
                         num_kv_heads=c.num_kv_heads, qk_norm=lambda d: Gemma4RMSNorm(d, eps=c.eps))
        self.k_eq_v, self.shared = k_eq_v and not shared, shared
        self.v_norm = UnitRMSNorm(c.eps)
        if shared:
            del self.key, self.value
            self.k_norm = None
        elif k_eq_v:
            del self.value
        self.packed_qkv = PackedLinears([m for m in (self.query, getattr(self, "key", None),
                                                    getattr(self, "value", None)) if m is not None])

    def _qkv(self, x: torch.Tensor, o: AttentionOptions):
        """q (B, H, N, d_k), k and v (B, H_kv, M, d_k): projected, normalised, rotated, hooked and joined to
        the cache. A KV-sharing layer's hook_k / hook_v see the keys and values it reads (every token's)."""
        out = self.packed_qkv(x) if len(self.packed_qkv.layers) > 1 else None  # one layer: Linear's own path
        if out is None:
            out = [m(x) for m in self.packed_qkv.layers]
        q = self.q_norm(self._split(out[0], self.num_heads))
        if o.rope is not None:
            q = apply_rope(q, o.rope, self.rope_layout)
        if self.shared:
            if o.kv is None or o.kv.k is None:
                raise RuntimeError("a KV-sharing layer needs the keys and values of the layer it reads (opts.kv)")
            k, v = o.kv.k, o.kv.v
        else:
            k = self.k_norm(self._split(out[1], self.num_kv_heads))
            if o.rope is not None:
                k = apply_rope(k, o.rope, self.rope_layout)
            v = self.v_norm(self._split(out[1] if self.k_eq_v else out[2], self.num_kv_heads))
        lh = o.hooks
        if lh is not None:
            q, k, v = lh("attn.hook_q", q), lh("attn.hook_k", k), lh("attn.hook_v", v)
        if o.kv is not None and not self.shared:
            k, v = o.kv.extend(k, v)
        return q, k, v


class Gemma4Block(TransformerBlock):
    """Gemma 4's decoder layer: Gemma 3's sandwich block with plain RMSNorms and Gemma4Attention, then the
    per-layer-input branch and the layer scalar:
        x = x + post_attn_norm(attn(norm1(x)));  x = x + post_mlp_norm(mlp(norm2(x)))
        x = x + per_layer_norm(per_layer_proj(act(per_layer_gate(x)) · layer_input))   (PLE models)
        x = x · layer_scalar
    hook_resid_post is after the scalar; the per-layer branch has no hook point of its own."""

    def __init__(self, cfg: Gemma4Config, layer: int):
        c = cfg.block(layer)
        super().__init__(c, layer)
        self.norm1, self.norm2 = Gemma4RMSNorm(c.dim, eps=c.eps), Gemma4RMSNorm(c.dim, eps=c.eps)
        self.post_attn_norm, self.post_mlp_norm = Gemma4RMSNorm(c.dim, eps=c.eps), Gemma4RMSNorm(c.dim, eps=c.eps)
        self.attn = Gemma4Attention(c, k_eq_v=cfg.k_eq_v and not cfg.is_local(layer), shared=cfg.shared(layer))
        self.act = activation(cfg.act)
        P = cfg.per_layer_dim
        if P:
            self.per_layer_gate = Linear(cfg.dim, P, bias=False)
            self.per_layer_proj = Linear(P, cfg.dim, bias=False)
            self.per_layer_norm = Gemma4RMSNorm(cfg.dim, eps=cfg.eps)
        else:
            self.per_layer_gate = self.per_layer_proj = self.per_layer_norm = None
        self.register_buffer("layer_scalar", torch.ones(1))
        if cfg.moe is not None:  # post_feedforward_layernorm_1: the dense MLP's own norm before the sum
            self.moe = Gemma4MoE(cfg.dim, cfg.moe, cfg.eps, cfg.act)
            self.post_dense_norm = Gemma4RMSNorm(cfg.dim, eps=cfg.eps)
        else:
            self.moe = None

    def forward(self, x: torch.Tensor, opts: AttentionOptions | None = None):
        lh = opts.hooks if opts is not None else None
        hook = lh if lh is not None else _no_hook
        x = hook("hook_resid_pre", x)
        a, probs = self.attn(self.norm1(x), opts)
        x = x + hook("hook_attn_out", self.post_attn_norm(a))
        h = self.mlp(self.norm2(x))
        if self.moe is not None:  # the experts beside the dense MLP, routed on x itself
            h = self.post_dense_norm(h) + self.moe.norm_out(self.moe(x, lh))
        x = x + hook("hook_mlp_out", self.post_mlp_norm(h))
        if self.per_layer_gate is not None:
            g = half_grad(act_rule(self.act, self.per_layer_gate(x))) * half_grad(opts.layer_input)
            x = x + self.per_layer_norm(self.per_layer_proj(g))
        return hook("hook_resid_post", x * self.layer_scalar), probs


class _PassKV(LayerKV):
    """A cache slot that keeps nothing: a layer no other layer reads, in a forward without a KV cache."""

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return k, v


class Gemma4(Llama):
    causal = True

    def __init__(self, cfg: Gemma4Config):
        super().__init__(cfg)
        self.blocks = BlockStack([Gemma4Block(cfg, i) for i in range(cfg.num_layers)])
        self.norm = Gemma4RMSNorm(cfg.dim, eps=cfg.eps)
        L, P = cfg.num_layers, cfg.per_layer_dim
        if P:
            self.embed_per_layer = nn.Embedding(cfg.per_layer_vocab, L * P)  # embed_tokens_per_layer
            self.per_layer_projection = Linear(cfg.dim, L * P, bias=False)  # per_layer_model_projection
            self.per_layer_norm = Gemma4RMSNorm(P, eps=cfg.eps)  # per_layer_projection_norm

    def rope(self, start: int, n: int, device, dtype, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Llama.rope's tables, as wide as the local or the global layers' d_k."""
        end, cfg = start + n, self.cfg
        theta, scaling = (cfg.rope_local_theta, cfg.rope_local_scaling) if local else (cfg.rope_theta, cfg.rope_scaling)
        t = self._rope_cache.get(local)
        stale = t is not None and t[0].is_inference() and not torch.is_inference_mode_enabled()
        if t is None or stale or t[0].shape[0] < end or t[0].device != device or t[0].dtype != dtype:
            size = max(end, 64 if t is None else 2 * t[0].shape[0])
            t = rope_tables(size, cfg.rope_dim(local), theta, device=device, dtype=dtype, scaling=scaling)
            self._rope_cache[local] = t
        return t[0][start:end], t[1][start:end]

    def new_cache(self, keep: bool = True) -> KVCache:
        """Every layer's slot; a KV-sharing layer's is the slot of the layer it reads. keep=False (a forward
        without a cache): only the layers read by others keep their keys and values."""
        cache = KVCache(self.cfg.num_layers)
        sources = self.cfg.kv_source or [None] * self.cfg.num_layers
        if not keep:
            cache.layers = [LayerKV() if i in sources else _PassKV() for i in range(self.cfg.num_layers)]
        for i, s in enumerate(sources):
            if s is not None:
                cache.layers[i] = cache.layers[s]
        return cache

    def per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(B, N, L, P): each layer's input vector per token, (projected embedding, normalised, + the token's
        per-layer embedding) / sqrt(2)."""
        cfg, (B, N) = self.cfg, ids.shape
        L, P = cfg.num_layers, cfg.per_layer_dim
        w = self.embed_per_layer.weight
        tok = self.embed_per_layer(ids) * torch.tensor(P ** 0.5, dtype=w.dtype, device=w.device)
        proj = self.per_layer_norm((self.per_layer_projection(x) * cfg.dim ** -0.5).reshape(B, N, L, P))
        return (proj + tok.reshape(B, N, L, P)) * 2.0 ** -0.5

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, dk_scale: float = 1.0,
                dk_layers=None, output_attentions: bool = False, hooks: Hooks | None = None,
                cache: KVCache | None = None, **_) -> ModelOutput:
        """As Llama.forward. Without a cache, a cache that keeps only the keys and values some later layer
        reads carries them to it (KV sharing)."""
        cfg = self.cfg
        N = input_ids.shape[1]
        past = decoder_start(cache, N, cfg.max_positions)
        if cfg.placeholder_ids:  # a placeholder with no image/audio behind it: the padding token, as transformers
            marks = torch.tensor(cfg.placeholder_ids, device=input_ids.device)
            input_ids = torch.where(torch.isin(input_ids, marks), cfg.placeholder_pad, input_ids)
        x = self.embed_tokens(input_ids)
        x = x * torch.tensor(cfg.dim ** 0.5, dtype=x.dtype, device=x.device)
        inputs = self.per_layer_inputs(input_ids, x) if cfg.per_layer_dim else None
        opts = Gemma4Options(mask=key_padding_mask(attention_mask), causal=True, dk_scale=dk_scale,
                             scale=cfg.attn_scale, softcap=cfg.attn_softcap)
        tables = {local: self.rope(past, N, x.device, x.dtype, local=local) for local in (False, True)}
        windows = cfg.sliding_windows or [None] * cfg.num_layers
        layer_opts = [dict(window=windows[i], rope=tables[cfg.is_local(i)],
                           layer_input=None if inputs is None else inputs[:, :, i]) for i in range(cfg.num_layers)]
        if cache is None and cfg.kv_source and any(s is not None for s in cfg.kv_source):
            cache = self.new_cache(keep=False)
        x, attn = self.blocks(x, opts, dk_layers=dk_layers, output_attentions=output_attentions, hooks=hooks,
                              cache=cache, layer_opts=layer_opts)
        return ModelOutput(hidden=self.norm(x), attentions=attn)
