"""Vision transformers: ViT, DeiT (class + distillation token), DINOv2 (patch 14, LayerScale), and the
vision towers of CLIP (a LayerNorm on the embeddings, quick-GELU, last hidden state not normed) and
SigLIP (no class token).

An image becomes a grid of patch tokens, a [CLS] token is put in front, learned positions are added
(resized bicubically when the grid differs from the one trained on), then pre-LN blocks run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attn_explorer.core.attention import AttentionOptions
from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock
from attn_explorer.core.layers import make_norm
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.patches import PatchEmbed, resize_position_grid
from attn_explorer.core.hooks import Hooks


@dataclass
class ViTConfig:
    image_size: int = 224  # side the position table was trained for
    patch_size: int = 16
    channels: int = 3
    dim: int = 768
    num_layers: int = 12
    num_heads: int = 12
    mlp_hidden: int = 3072
    eps: float = 1e-12  # LayerNorm epsilon (DINOv2: 1e-6)
    act: str = "gelu"
    qkv_bias: bool = True
    distillation_token: bool = False  # DeiT puts a second learned token after [CLS]
    layerscale: float | None = None  # DINOv2: LayerScale on both residual branches
    mask_token: bool = False  # DINOv2 checkpoints carry an (unused here) mask token
    pooler: bool = False  # ViTModel's dense+tanh head on [CLS]
    num_labels: int = 0  # classifier outputs; 0 = backbone only
    classifier_tokens: int = 1  # DeiT-with-teacher averages the [CLS] and distillation heads
    class_token: bool = True  # SigLIP has none: every token is a patch
    patch_bias: bool = True  # CLIP's patch projection has no bias
    pre_norm: bool = False  # CLIP: a LayerNorm on the embeddings before the first block (pre_layrnorm)
    norm_output: bool = True  # CLIP: False, the last hidden state is not normed (its post_layernorm is for the pooled [CLS])
    flat_tables: bool = False  # CLIP/SigLIP store the class vector as (D,) and the position table as (N, D)

    @property
    def num_extra_tokens(self) -> int:
        return int(self.class_token) + int(self.distillation_token)

    @property
    def native_grid(self) -> int:
        return self.image_size // self.patch_size


class VisionTransformer(nn.Module):
    causal = False

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        D = cfg.dim
        self.patch_embed = PatchEmbed(cfg.patch_size, D, cfg.channels)
        if not cfg.patch_bias:
            self.patch_embed.proj.register_parameter("bias", None)
        lead = () if cfg.flat_tables else (1,)  # the tables' stored shapes; forward views them as (1, n, D)
        self.cls_token = nn.Parameter(torch.zeros(*lead, *lead, D)) if cfg.class_token else None
        self.pre_norm = nn.LayerNorm(D, eps=cfg.eps) if cfg.pre_norm else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.distillation_token else None
        self.mask_token = nn.Parameter(torch.zeros(1, D)) if cfg.mask_token else None
        self.pos_embed = nn.Parameter(torch.zeros(*lead, cfg.native_grid**2 + cfg.num_extra_tokens, D))
        self.blocks = BlockStack(
            [
                TransformerBlock(BlockConfig(
                    D, cfg.num_heads, cfg.mlp_hidden, norm_first=True, act=cfg.act, eps=cfg.eps,
                    qkv_bias=cfg.qkv_bias, layerscale=cfg.layerscale,
                ), i)
                for i in range(cfg.num_layers)
            ]
        )
        self.norm = make_norm("layer", D, cfg.eps)  # LayerNorm: core.explain's rule applies
        self.pooler = nn.Linear(D, D) if cfg.pooler else None
        self.heads = nn.ModuleList(nn.Linear(D, cfg.num_labels) for _ in range(cfg.classifier_tokens)) if cfg.num_labels else None

    def positions(self, grid: tuple[int, int], height: int, width: int) -> torch.Tensor:
        """Position vectors for the extra tokens and a rows × cols patch grid: (1, E + rows*cols, D)."""
        E = self.cfg.num_extra_tokens
        pos = self.pos_embed.view(1, -1, self.cfg.dim)
        native = pos.shape[1] - E
        if grid[0] * grid[1] == native and height == width:
            return pos
        return torch.cat([pos[:, :E], resize_position_grid(pos[:, E:], grid)], dim=1)

    def forward(
        self,
        pixels: torch.Tensor,
        dk_scale: float = 1.0,
        dk_layers=None,
        output_attentions: bool = False,
        hooks: Hooks | None = None,
        **_,
    ) -> ModelOutput:
        """pixels (B, C, H, W), normalised. Returns hidden (B, E + rows*cols, D) after the final norm."""
        B, _, height, width = pixels.shape
        x, grid = self.patch_embed(pixels.to(self.patch_embed.proj.weight.dtype))  # (B, rows*cols, D)
        extra = [t.view(1, 1, -1).expand(B, -1, -1) for t in (self.cls_token, self.dist_token) if t is not None]
        x = torch.cat(extra + [x], dim=1) if extra else x
        x = x + self.positions(grid, height, width)
        if self.pre_norm is not None:
            x = self.pre_norm(x)
        x, attn = self.blocks(x, AttentionOptions(dk_scale=dk_scale), dk_layers=dk_layers,
                              output_attentions=output_attentions, hooks=hooks)
        if self.cfg.norm_output:
            x = self.norm(x)
        logits = None
        if self.heads is not None:
            logits = sum(head(x[:, i]) for i, head in enumerate(self.heads)) / len(self.heads)
        return ModelOutput(hidden=x, attentions=attn, logits=logits, grid=grid)
