"""The Mamba-2 hybrids on our Llama decoder: Granite 4 hybrid (granitemoehybrid) and Falcon-H1 (falcon_h1).

Granite 4: each layer is either a Mamba-2 mixer or softmax attention (layer_types), in the attention's place of a
pre-norm block with Granite's multipliers (embeddings, each branch, the attention scale, the logits' divisor); the
attention may use no RoPE at all (position_embedding_type other than "rope"). The MLP is routed experts (top-k of
the router's logits, a softmax over those k; experts in the checkpoint's F.linear layout) plus a shared SwiGLU
every token uses, or the shared SwiGLU alone where num_local_experts is 0:

    x = x + r · mixer(norm1(x));  x = x + r · (experts(norm2(x)) + shared(norm2(x)))

Falcon-H1: every layer runs a Mamba-2 mixer and softmax attention side by side on one norm, each with its own
multipliers, then a SwiGLU with multipliers inside:

    h = norm1(x);  x = x + mamba(h) · m_ssm_out + attn(h · m_attn_in) · m_attn_out
    x = x + down(up(h2) · silu(gate(h2) · m_gate)) · m_down,   h2 = norm2(x)

The attention's key_multiplier scales its keys: the logits' scale is key_multiplier / sqrt(d_k) (the same product).
Falcon-H1's maps are its attention's; its Mamba-2 mixer (`block.mamba`) runs beside them with no hooks and no map.
Generation keeps a core.mamba2.MambaState per Mamba-2 layer in the KVCache (Falcon-H1: beside the layer's keys
and values, HybridKV).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.attention import AttentionOptions, KVCache, LayerKV
from attn_explorer.core.blocks import TransformerBlock, _no_hook
from attn_explorer.core.explain import act_rule, half_grad
from attn_explorer.core.layers import SwiGLU
from attn_explorer.core.linear import Linear
from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.mamba2 import Mamba2Config, Mamba2Mixer, MambaState
from attn_explorer.core.moe import MoE, MoEConfig
from attn_explorer.core.recurrent import MIXER_WORDS


@dataclass
class MambaHybridConfig(LlamaConfig):
    """LlamaConfig plus the Mamba-2 layers (Granite 4: mamba_layers; Falcon-H1: parallel_mamba, its multipliers)."""

    family: str = "granitemoehybrid"
    mamba: Mamba2Config | None = None  # every Mamba-2 mixer's sizes
    mamba_layers: list | None = None  # per layer, True: a Mamba-2 mixer instead of attention (Granite 4)
    shared_mlp: bool = False  # Granite 4: the MLP is (experts +) a shared SwiGLU with one gate_up projection
    # Falcon-H1: a Mamba-2 mixer beside the attention on every layer, and its multipliers
    parallel_mamba: bool = False
    attn_in_multiplier: float = 1.0
    attn_out_multiplier: float = 1.0
    mlp_multipliers: tuple = (1.0, 1.0)  # (gate, down)

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.mamba, dict):  # a checkpoint's stored config gives plain objects
            self.mamba = Mamba2Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in self.mamba.items()})
        self.mlp_multipliers = tuple(self.mlp_multipliers)

    def is_mamba(self, layer: int) -> bool:
        """Whether layer's mixer is Mamba-2 alone (Granite 4's mamba layers)."""
        return bool(self.mamba_layers and self.mamba_layers[layer])

    def block(self, layer: int):
        """Llama's block, with the Mamba-2 mixer as its `attn` on Granite 4's Mamba-2 layers (core.recurrent)."""
        b = super().block(layer)
        return replace(b, mixer=self.mamba) if self.is_mamba(layer) else b

    def mixers(self) -> list[str]:
        """Per layer, whose maps it shows (ModelInfo.mixers): "mamba2" or "softmax" (Falcon-H1: its attention)."""
        return ["mamba2" if self.is_mamba(i) else "softmax" for i in range(self.num_layers)]

    def layer_heads(self) -> list[int]:
        return [self.mamba.num_heads if self.is_mamba(i) else self.num_heads for i in range(self.num_layers)]

    def layer_kinds(self) -> list[str]:
        """Per layer, for people (the grid marks each row's mixer, as Qwen3.5's): "Mamba-2 (implicit)", "softmax,
        global" (", no positions" without RoPE); Falcon-H1: "softmax, global + Mamba-2 (not drawn)"."""
        kinds = [f"softmax, {k}" for k in super().layer_kinds()]
        if self.parallel_mamba:
            return [f"{k} + Mamba-2 (not drawn)" for k in kinds]
        return [MIXER_WORDS["mamba2"] if self.is_mamba(i) else k for i, k in enumerate(kinds)]


class GraniteExperts(nn.Module):
    """Every expert's weights as the checkpoint stores them, F.linear layout: gate_up (E, 2I, D), the gate's
    rows first, and down (E, D, I)."""

    def __init__(self, dim: int, cfg: MoEConfig):
        super().__init__()
        self.gate_up = nn.Parameter(torch.zeros(cfg.num_experts, 2 * cfg.hidden, dim))
        self.down = nn.Parameter(torch.zeros(cfg.num_experts, dim, cfg.hidden))


class GraniteMoE(MoE):
    """core.moe.MoE's routing ("topk_softmax": the k best logits, a softmax over them), hooks and weighted sum,
    with Granite's expert layout and its shared SwiGLU (one gate_up projection) added for every token."""

    def __init__(self, dim: int, cfg: MoEConfig):
        super().__init__(dim, replace(cfg, shared_hidden=0, stacked=True))  # MoE's every other part, as it grows
        self.cfg = cfg
        self.experts = GraniteExperts(dim, cfg)
        self.shared = SwiGLU(dim, cfg.shared_hidden, fused=True)

    def expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(h, self.experts.gate_up[e]).chunk(2, dim=-1)
        return F.linear(half_grad(act_rule(F.silu, gate)) * half_grad(up), self.experts.down[e])


class SharedOnly(nn.Module):
    """Granite 4 without experts (num_local_experts 0): the shared SwiGLU alone, under the same name."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.shared = SwiGLU(dim, hidden, fused=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(x)


class FalconMLP(nn.Module):
    """Falcon-H1's SwiGLU: down(up(x) · silu(gate(x) · m_gate)) · m_down."""

    def __init__(self, dim: int, hidden: int, bias: bool, multipliers: tuple):
        super().__init__()
        self.gate, self.up, self.down = Linear(dim, hidden, bias=bias), Linear(dim, hidden, bias=bias), Linear(
            hidden, dim, bias=bias)
        self.gate_multiplier, self.down_multiplier = multipliers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = half_grad(act_rule(F.silu, self.gate(x) * self.gate_multiplier)) * half_grad(self.up(x))
        return self.down(a) * self.down_multiplier


class HybridKV(LayerKV):
    """A Falcon-H1 layer's cache: the attention's keys and values (LayerKV) and its Mamba-2 state beside them."""

    def __init__(self):
        super().__init__()
        self.mamba = MambaState()

    def truncate(self, n: int) -> None:
        self.mamba.truncate(n)
        super().truncate(n)


class FalconH1Block(TransformerBlock):
    """One Falcon-H1 layer (module docstring): attention and a Mamba-2 mixer on one norm, then the MLP. Hooks:
    the block's own; hook_attn_out is both mixers' sum (the branch's addition); the attention's maps and
    attn.hook_* points are the softmax attention's."""

    def __init__(self, cfg, layer: int, hybrid: MambaHybridConfig):
        super().__init__(cfg, layer)
        self.mamba = Mamba2Mixer(hybrid.mamba)
        self.mlp = FalconMLP(cfg.dim, cfg.mlp_hidden, cfg.mlp_bias, hybrid.mlp_multipliers)
        self.attn_in, self.attn_out = hybrid.attn_in_multiplier, hybrid.attn_out_multiplier

    def forward(self, x: torch.Tensor, opts: AttentionOptions | None = None):
        opts = AttentionOptions() if opts is None else opts
        lh = opts.hooks
        hook = lh if lh is not None else _no_hook
        x = hook("hook_resid_pre", x)
        h = self.norm1(x)
        kv = opts.kv
        m, _ = self.mamba(h, replace(opts, hooks=None, need_weights=False, probs_out=None,
                                     kv=None if kv is None else kv.mamba))
        a, probs = self.attn(h * self.attn_in if self.attn_in != 1.0 else h, opts)
        x = x + hook("hook_attn_out", m + a * self.attn_out)
        out = x + hook("hook_mlp_out", self.mlp(self.norm2(x)))
        return hook("hook_resid_post", out), probs


class MambaHybrid(Llama):
    """Our Llama decoder with Mamba-2 mixers (module docstring): Granite 4's per-layer choice, Falcon-H1's
    parallel layers."""

    def __init__(self, cfg: MambaHybridConfig):
        super().__init__(cfg)
        for i, block in enumerate(self.blocks.layers):
            if cfg.parallel_mamba:
                self.blocks.layers[i] = FalconH1Block(cfg.block(i), i, cfg)
                continue
            if cfg.shared_mlp:
                block.mlp = GraniteMoE(cfg.dim, cfg.moe) if cfg.is_moe(i) else SharedOnly(cfg.dim, cfg.mlp_hidden)

    def new_cache(self) -> KVCache:
        cache = KVCache(self.cfg.num_layers)
        if self.cfg.parallel_mamba:
            cache.layers = [HybridKV() for _ in range(self.cfg.num_layers)]
        else:
            cache.layers = [MambaState() if self.cfg.is_mamba(i) else LayerKV() for i in range(self.cfg.num_layers)]
        return cache
