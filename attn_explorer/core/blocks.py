"""The transformer block, pre-LN (the primer's x = x + MHA(LN(x))) and post-LN (BERT), and the stack of them."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from attn_explorer.core.attention import AttentionOptions, KVCache, MultiHeadAttention
from attn_explorer.core.hooks import Hooks
from attn_explorer.core import progress
from attn_explorer.core.layers import MLP, HeadsRMSNorm, LayerScale, PerHeadLayerNorm, SwiGLU, make_norm
from attn_explorer.core.mla import MLAConfig, MultiHeadLatentAttention
from attn_explorer.core.moe import MoE, MoEConfig


def _no_hook(point: str, x: torch.Tensor) -> torch.Tensor:
    return x


def _residual(x: torch.Tensor, branch: torch.Tensor, lh, point: str) -> torch.Tensor:
    """x + branch. Where no hook is on the branch's point (none saw it, so none holds it) and there is no autograd,
    the sum is written into the branch, the new tensor its sub-layer just made (issue 24 A): the same numbers
    (a sum does not depend on its order), one (B, N, D) tensor fewer. x itself is never changed."""
    tracked = torch.is_grad_enabled() and (x.requires_grad or branch.requires_grad)
    if ((lh is None or not lh.wants(point)) and not tracked and branch.shape == x.shape and branch.dtype == x.dtype
            and branch.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()):
        return branch.add_(x)
    return x + branch


@dataclass(frozen=True)
class BlockConfig:
    """Everything one block is built from (a family's config says it per layer: `cfg.block(layer)`)."""

    dim: int  # D
    num_heads: int  # H
    mlp_hidden: int  # the feed-forward width
    norm_first: bool = True  # pre-LN (GPT-2, ViT, Llama); False: post-LN (BERT)
    act: str = "gelu"  # the MLP's activation
    eps: float = 1e-5  # the norms' epsilon
    norm: str = "layer"  # "layer", "rms" or "rms1p" (Gemma's (1 + w))
    mlp: str = "mlp"  # "mlp" (fc1, act, fc2) or "swiglu" (gate, up, down)
    qkv_bias: bool = True
    mlp_bias: bool = True
    attn_out_bias: bool = True  # W_O's bias, apart from the MLP's
    fused_qkv: bool = False  # one (D -> 3·D) projection `qkv` (GPT-2, Phi-3, GPT-NeoX)
    layerscale: float | None = None  # DINOv2's per-channel branch scale (its initial value)
    num_kv_heads: int | None = None  # grouped-query attention (None: H)
    head_dim: int | None = None  # d_k when it is not D / H
    qk_norm: bool = False  # q and k normalised per head (Qwen3, Gemma 3), with the block's norm kind
    sandwich: bool = False  # Gemma 2/3: each branch normalised again before the residual sum
    mlp_act: str = "silu"  # the gated MLP's activation
    parallel: bool = False  # GPT-NeoX's parallel residual
    qkv_layout: str = "stacked"  # a fused qkv's rows: "stacked" or "per_head" (GPT-NeoX)
    fused_gate_up: bool = False  # the SwiGLU's gate and up as one projection (Phi-3)
    pre_norms: bool = True  # False: no norm before either branch, only sandwich's after each (OLMo 2)
    qk_norm_full: bool = False  # qk_norm over all heads' q (k) together, H·d_k wide, not per head (OLMo 2)
    residual_scale: float = 1.0  # each branch times this before the residual sum (Granite's residual_multiplier)
    # gpt-oss:
    sinks: bool = False  # a learned sink logit per head joins each row's softmax (core.sinks)
    rope_layout: str = "half"  # which of d_k's dimensions RoPE pairs (positional.apply_rope): "half", "pairs", "pairs_in"
    # MoE (Qwen3-MoE, gpt-oss, Llama 4, DeepSeek-V3):
    moe: MoEConfig | None = None  # set: the MLP is core.moe.MoE (routed experts; mlp_hidden unused)
    # DeepSeek-V3:
    mla: MLAConfig | None = None  # set: the attention is core.mla.MultiHeadLatentAttention (latent q, k, v)
    # Llama 4:
    qk_rms_after_rope: bool = False  # q and k divided by their RMS (eps, no weight) after RoPE (use_qk_norm)
    # Cohere / Cohere 2:
    one_norm: bool = False  # with parallel: both branches read norm1's output; there is no norm2
    rope_float32: bool = False  # q and k turned in float32 whatever the model's dtype (MultiHeadAttention)
    qk_norm_per_head: bool = False  # q and k each through a bias-free LayerNorm with a weight per head (Command R+)
    # Hybrids (core.recurrent: Qwen3.5 / Qwen3-Next's Gated DeltaNet, Mamba-2):
    mixer: object | None = None  # set: the block's `attn` is mixer.build(dim), a core.recurrent.RecurrentMixer
    output_gate: bool = False  # Qwen3.5 / Qwen3-Next: q_proj twice as wide, each head's output times sigmoid(gate)


class TransformerBlock(nn.Module):
    """One attention sub-layer and one MLP sub-layer, each with a residual connection.

    norm_first=True (pre-LN; GPT-2, ViT, the primer):
        x = x + MHA(LN1(x));  x = x + MLP(LN2(x))
    norm_first=False (post-LN; the original Transformer, BERT):
        x = LN1(x + MHA(x));  x = LN2(x + MLP(x))
    layerscale (DINOv2) multiplies each branch by a learned per-channel vector.
    mlp_bias gives the MLP's layers biases; attn_out_bias does the same for W_O, on its own.
    sandwich=True (Gemma 2/3) also normalises each branch's output before the residual sum:
        x = x + post_attn_norm(MHA(LN1(x)));  x = x + post_mlp_norm(MLP(LN2(x)))
    head_dim sets d_k when it is not dim / num_heads; qk_norm=True normalises q and k per head
    (with the block's norm kind, over d_k); mlp_act is the gated MLP's activation.
    pre_norms=False with sandwich=True (OLMo 2) keeps only the norms after each branch:
        x = x + post_attn_norm(MHA(x));  x = x + post_mlp_norm(MLP(x))
    qk_norm_full=True normalises q (and k) over every head's dimensions at once (OLMo 2), RMSNorm only.
    residual_scale (Granite) multiplies each branch's addition: x = x + r·MHA(LN1(x)), likewise the MLP.
    parallel=True (GPT-NeoX, Pythia) sums both branches, each read from the block's input:
        x = x + MHA(LN1(x)) + MLP(LN2(x))
    one_norm=True with parallel (Cohere, Command R) reads both branches from one norm:
        x = x + MHA(LN1(x)) + MLP(LN1(x))
    moe (Qwen3-MoE, gpt-oss, Llama 4, DeepSeek-V3) makes the MLP a core.moe.MoE: each token's own k experts.
    Built from one BlockConfig; `layer` is its index in the stack.
    """

    def __init__(self, cfg: BlockConfig, layer: int = 0):
        super().__init__()
        c = cfg
        self.cfg, self.layer = cfg, layer
        self.norm_first = c.norm_first
        self.parallel = c.parallel
        if not c.pre_norms and not c.sandwich:
            raise ValueError("pre_norms=False needs sandwich=True (the norms after each branch)")
        self.norm1 = make_norm(c.norm, c.dim, c.eps) if c.pre_norms else nn.Identity()
        # DeepSeek-V3 (c.mla): multi-head latent attention instead, its sizes in c.mla
        self.attn = c.mixer.build(c.dim) if c.mixer is not None else MultiHeadLatentAttention(
            c.dim, c.num_heads, c.mla, c.rope_layout) if c.mla else MultiHeadAttention(
            c.dim, c.num_heads, qkv_bias=c.qkv_bias, out_bias=c.attn_out_bias, fused_qkv=c.fused_qkv,
            num_kv_heads=c.num_kv_heads, qkv_layout=c.qkv_layout, head_dim=c.head_dim,
            qk_norm=(lambda d: make_norm(c.norm, d, c.eps)) if c.qk_norm and not c.qk_norm_full else None,
            rope_layout=c.rope_layout, sinks=c.sinks, qk_rms_after_rope=c.eps if c.qk_rms_after_rope else None,
            rope_float32=c.rope_float32, output_gate=c.output_gate,
        )
        if c.qk_norm_full:
            if c.norm != "rms":
                raise ValueError(f"qk_norm_full needs norm 'rms', got {c.norm!r}")
            a = self.attn
            a.q_norm = HeadsRMSNorm(a.num_heads * a.head_dim, c.eps)
            a.k_norm = HeadsRMSNorm(a.num_kv_heads * a.head_dim, c.eps)
        if c.qk_norm_per_head:  # Command R+ (use_qk_norm): core.layers.PerHeadLayerNorm, before RoPE
            a = self.attn
            a.q_norm = PerHeadLayerNorm(a.num_heads, a.head_dim, c.eps)
            a.k_norm = PerHeadLayerNorm(a.num_kv_heads, a.head_dim, c.eps)
        if c.one_norm and not c.parallel:
            raise ValueError("one_norm needs parallel=True (both branches reading the block's input)")
        self.one_norm = c.one_norm
        self.norm2 = make_norm(c.norm, c.dim, c.eps) if c.pre_norms and not c.one_norm else nn.Identity()
        self.residual_scale = c.residual_scale
        if c.moe is not None:
            self.mlp = MoE(c.dim, c.moe)
        else:
            self.mlp = (SwiGLU(c.dim, c.mlp_hidden, bias=c.mlp_bias, act=c.mlp_act, fused=c.fused_gate_up)
                        if c.mlp == "swiglu" else MLP(c.dim, c.mlp_hidden, c.act, c.mlp_bias))
        self.ls1 = LayerScale(c.dim, c.layerscale) if c.layerscale is not None else nn.Identity()
        self.ls2 = LayerScale(c.dim, c.layerscale) if c.layerscale is not None else nn.Identity()
        if c.sandwich:
            self.post_attn_norm, self.post_mlp_norm = make_norm(c.norm, c.dim, c.eps), make_norm(c.norm, c.dim, c.eps)
        else:
            self.post_attn_norm = self.post_mlp_norm = nn.Identity()

    def forward(
        self, x: torch.Tensor, opts: AttentionOptions | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """opts.hooks (core.hooks.LayerHooks): this block's hook_resid_pre, hook_attn_out, hook_mlp_out and
        hook_resid_post (and its attention's). attn_out and mlp_out are each branch's addition to the stream:
        pre-LN and parallel blocks: resid_post = resid_pre + attn_out + mlp_out exactly; post-LN: before the
        norms, x = norm2(norm1(resid_pre + attn_out) + mlp_out)."""
        lh = opts.hooks if opts is not None else None
        hook = lh if lh is not None else _no_hook
        x = hook("hook_resid_pre", x)
        if self.parallel:  # both branches read the block's input (GPT-NeoX's use_parallel_residual)
            h = self.norm1(x)
            a, probs = self.attn(h, opts)
            a = hook("hook_attn_out", self._scaled(self.ls1(self.post_attn_norm(a))))
            h = h if self.one_norm else self.norm2(x)  # Cohere: the MLP reads the attention's input norm
            m = hook("hook_mlp_out", self._scaled(self.ls2(self.post_mlp_norm(self._mlp(h, lh)))))
            out = _residual(_residual(x, a, lh, "hook_attn_out"), m, lh, "hook_mlp_out")  # (x + a) + m
        elif self.norm_first:
            a, probs = self.attn(self.norm1(x), opts)
            x = _residual(x, hook("hook_attn_out", self._scaled(self.ls1(self.post_attn_norm(a)))), lh, "hook_attn_out")
            m = self._scaled(self.ls2(self.post_mlp_norm(self._mlp(self.norm2(x), lh))))
            out = _residual(x, hook("hook_mlp_out", m), lh, "hook_mlp_out")
        else:
            a, probs = self.attn(x, opts)
            x = self.norm1(_residual(x, hook("hook_attn_out", self.ls1(a)), lh, "hook_attn_out"))
            out = self.norm2(_residual(x, hook("hook_mlp_out", self.ls2(self._mlp(x, lh))), lh, "hook_mlp_out"))
        return hook("hook_resid_post", out), probs

    def _mlp(self, x: torch.Tensor, lh) -> torch.Tensor:
        """The MLP branch; an MoE one also hands its routing to the block's hooks (mlp.hook_expert_*)."""
        return self.mlp(x, lh) if isinstance(self.mlp, MoE) else self.mlp(x)

    def _scaled(self, branch: torch.Tensor) -> torch.Tensor:
        """A branch's addition to the stream: times residual_scale where it is not 1 (Granite)."""
        return branch if self.residual_scale == 1.0 else branch * self.residual_scale


class BlockStack(nn.Module):
    """Runs blocks in order and collects what was asked for.

    opts.dk_scale applies to the layers in dk_layers (all of them when None), so a change made in
    one layer carries through every layer after it.
    """

    def __init__(self, blocks: list[TransformerBlock]):
        super().__init__()
        self.layers = nn.ModuleList(blocks)

    def forward(
        self,
        x: torch.Tensor,
        opts: AttentionOptions | None = None,
        dk_layers=None,
        output_attentions: bool = False,
        hooks: Hooks | None = None,
        cache: KVCache | None = None,
        layer_opts: list[dict] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (x, attentions (B, L, H, N, M) or None); M = N, or past + N with a cache.

        opts: mask, causal, rope and dk_scale for every layer (need_weights, hooks and probs_out
        are set here, per layer). cache: each layer's past keys and values, extended by x's tokens.
        hooks: the forward's named hook points (core.hooks): hook_embed on x, then each block's.
        layer_opts: per layer, AttentionOptions fields that differ from opts (Gemma's sliding window
        and RoPE tables on its local layers).
        """
        opts = AttentionOptions() if opts is None else opts
        layers = None if dk_layers is None else set(int(i) for i in dk_layers)
        attn = None
        grads = torch.is_grad_enabled() and x.requires_grad  # autograd: the maps are stacked, not written in place
        per_layer = []
        heads = [block.attn.num_heads for block in self.layers]
        H = max(heads)  # hybrids (core.recurrent): a layer with fewer heads has zeros in heads H_layer..H-1
        if output_attentions and not grads:
            # Every layer's softmax is computed in place in its slice of one (L, B, H, N, N) buffer:
            # no per-layer n×n allocation and no final stack.
            B, N, _ = x.shape
            M = N + (cache.length if cache is not None else 0)
            attn = x.new_empty(len(self.layers), B, H, N, M)
        if hooks is not None:
            x = hooks("hook_embed", x)
        keep = hooks is not None and hooks.keep
        for i, block in enumerate(self.layers):
            lh = None if hooks is None else hooks.layer(i)
            if output_attentions and keep:
                raise ValueError(f"layer {i} keeps q, k and lse instead of its maps: it cannot also return them "
                                 "(output_attentions=True)")
            o = replace(
                opts, dk_scale=opts.dk_scale if layers is None or i in layers else 1.0,
                need_weights=output_attentions, hooks=lh,
                probs_out=None if attn is None or heads[i] != H else attn[i],
                kv=None if cache is None else cache.layers[i], **(layer_opts[i] if layer_opts else {}),
            )
            x, probs = block(x, o)
            progress.layer_done(i + 1, len(self.layers), x.shape[1], hooks.kept.get(i) if keep else None)  # issue 24
            if output_attentions and heads[i] != H:  # fewer heads than the widest layer: zeros past its own
                pad = probs.new_zeros((probs.shape[0], H - heads[i], *probs.shape[2:]))
                probs = torch.cat([probs, pad], dim=1)
                if attn is not None:
                    attn[i].copy_(probs)
            if grads and output_attentions:
                per_layer.append(probs)
        if per_layer:
            return x, torch.stack(per_layer, dim=1)  # (B, L, H, N, M), in the graph
        return x, (attn.transpose(0, 1) if attn is not None else None)  # (B, L, H, N, M)
