"""ModernBERT: a pre-LN encoder with rotary positions, global attention every few layers and bidirectional
local windows between (each token sees the tokens within ±window of it), a GeGLU MLP and bias-free
LayerNorms. Layer 0 has no attention norm: the embedding norm has just normalised its input.

The blocks are our TransformerBlock (fused Wqkv in the stacked layout, fused Wi as the GLU's gate_up,
input half activated) with ModernBERT's norms put in; a local layer's band is a bool mask of its own,
since core.masks' windows are causal.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from attn_explorer.core.attention import AttentionOptions
from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock
from attn_explorer.core.hooks import Hooks
from attn_explorer.core.layers import LayerNorm
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.positional import RopeScaling, rope_tables


@dataclass
class ModernBertConfig:
    vocab_size: int = 50368
    dim: int = 768  # hidden size D
    num_layers: int = 22  # L
    num_heads: int = 12  # H
    mlp_hidden: int = 1152  # the GLU's width (Wi is twice this: input and gate)
    max_positions: int = 8192  # the longest input RoPE was trained for
    eps: float = 1e-5  # the LayerNorms' epsilon (norm_eps)
    act: str = "gelu"  # the GLU's activation (hidden_activation)
    pad_token_id: int = 50283
    attention_bias: bool = False  # Wqkv and Wo
    mlp_bias: bool = False  # Wi and Wo
    norm_bias: bool = False  # every LayerNorm
    # per layer: None for a global layer, w for a local one (query i sees keys j with |i - j| <= w:
    # local_attention // 2)
    windows: list = field(default_factory=list)
    rope_theta: float = 160_000.0  # RoPE base of the global layers
    rope_local_theta: float = 10_000.0  # RoPE base of the local layers
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)  # the global layers' frequency scaling
    rope_local_scaling: RopeScaling = field(default_factory=RopeScaling)  # the local layers'

    def __post_init__(self):
        for name in ("rope_scaling", "rope_local_scaling"):  # a checkpoint's stored config gives plain objects
            if isinstance(getattr(self, name), dict):
                setattr(self, name, RopeScaling(**getattr(self, name)))
        if not self.windows:
            self.windows = [None] * self.num_layers

    @property
    def usable_positions(self) -> int:
        return self.max_positions

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def block(self) -> BlockConfig:
        return BlockConfig(
            self.dim, self.num_heads, self.mlp_hidden, norm_first=True, eps=self.eps, mlp="swiglu",
            mlp_act=self.act, act=self.act, fused_gate_up=True, fused_qkv=True, qkv_bias=self.attention_bias,
            attn_out_bias=self.attention_bias, mlp_bias=self.mlp_bias,
        )

    def layer_kinds(self) -> list[str]:
        """Per layer, for people: "local, window ±64" or "global"."""
        return [f"local, window ±{w}" if w is not None else "global" for w in self.windows]


class ModernBertBlock(TransformerBlock):
    """TransformerBlock (pre-LN, GeGLU) with ModernBERT's LayerNorms (bias only if norm_bias) and, in
    layer 0, no attention norm at all."""

    def __init__(self, cfg: ModernBertConfig, layer: int):
        super().__init__(cfg.block(), layer)
        self.norm1 = nn.Identity() if layer == 0 else LayerNorm(cfg.dim, eps=cfg.eps, bias=cfg.norm_bias)
        self.norm2 = LayerNorm(cfg.dim, eps=cfg.eps, bias=cfg.norm_bias)


class Embeddings(nn.Module):
    """Token embeddings, then a LayerNorm: no positions here (RoPE turns q and k in each layer)."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.norm = LayerNorm(cfg.dim, eps=cfg.eps, bias=cfg.norm_bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.word(ids))


def band_mask(n: int, window: int, device=None) -> torch.Tensor:
    """Bool (n, n): True where |i - j| <= window (a bidirectional sliding window of 2·window + 1 keys)."""
    i = torch.arange(n, device=device)
    return (i[:, None] - i[None, :]).abs() <= window


class ModernBert(nn.Module):
    causal = False

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.blocks = BlockStack([ModernBertBlock(cfg, i) for i in range(cfg.num_layers)])
        self.norm = LayerNorm(cfg.dim, eps=cfg.eps, bias=cfg.norm_bias)  # final_norm

    def rope(self, n: int, device, dtype, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) at positions 0..n-1, each (n, d_k), of the global layers or (local=True) the local ones."""
        cfg = self.cfg
        theta, scaling = (cfg.rope_local_theta, cfg.rope_local_scaling) if local else (cfg.rope_theta, cfg.rope_scaling)
        return rope_tables(n, cfg.head_dim, theta, device=device, dtype=dtype, scaling=scaling)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        dk_scale: float = 1.0,
        dk_layers=None,
        output_attentions: bool = False,
        hooks: Hooks | None = None,
        **_,
    ) -> ModelOutput:
        """input_ids (B, N); attention_mask (B, N) with 1 for real tokens, 0 for padding (positions count
        0..N-1 whatever the padding, as in transformers)."""
        N = input_ids.shape[1]
        x = self.embeddings(input_ids)
        pad = None
        if attention_mask is not None and not bool(attention_mask.all()):
            pad = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, N): padding keys get no weight
        opts = AttentionOptions(mask=pad, dk_scale=dk_scale, rope=self.rope(N, x.device, x.dtype))
        layer_opts = None
        if any(w is not None for w in self.cfg.windows):
            local_rope = self.rope(N, x.device, x.dtype, local=True)
            bands = {}
            layer_opts = []
            for w in self.cfg.windows:
                if w is None:
                    layer_opts.append({})
                    continue
                if w not in bands:
                    band = band_mask(N, w, x.device)  # (N, N)
                    bands[w] = band if pad is None else band & pad  # (B, 1, N, N) with padding
                layer_opts.append({"mask": bands[w], "rope": local_rope})
        x, attn = self.blocks(x, opts, dk_layers=dk_layers, output_attentions=output_attentions, hooks=hooks,
                              layer_opts=layer_opts)
        return ModelOutput(hidden=self.norm(x), attentions=attn)
