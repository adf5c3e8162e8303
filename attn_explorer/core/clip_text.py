"""CLIP's text tower: learned positions, pre-LN blocks with a causal mask, and a final LayerNorm.

Like GPT-2 without the fused QKV or an LM head: each token sees itself and the tokens before it, and
the text's embedding is read at its end token. It embeds text; it does not generate.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attn_explorer.core.attention import AttentionOptions, key_padding_mask
from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.hooks import Hooks


@dataclass
class ClipTextConfig:
    vocab_size: int = 49408
    dim: int = 512  # hidden_size
    num_layers: int = 12
    num_heads: int = 8
    mlp_hidden: int = 2048  # intermediate_size
    max_positions: int = 77  # max_position_embeddings
    eps: float = 1e-5  # layer_norm_eps
    act: str = "quick_gelu"  # x·σ(1.702x)

    @property
    def usable_positions(self) -> int:
        return self.max_positions


class ClipTextTransformer(nn.Module):
    causal = True
    can_generate = False
    text_encoder = True  # causal, yet it embeds text: it has no language-model head by design

    def __init__(self, cfg: ClipTextConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.position_embedding = nn.Embedding(cfg.max_positions, cfg.dim)
        self.blocks = BlockStack(
            [
                TransformerBlock(BlockConfig(cfg.dim, cfg.num_heads, cfg.mlp_hidden, norm_first=True, act=cfg.act, eps=cfg.eps), i)
                for i in range(cfg.num_layers)
            ]
        )
        self.final_layer_norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)

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
        """input_ids (B, N), N <= max_positions; attention_mask (B, N), 1 = a real token."""
        N = input_ids.shape[1]
        if N > self.cfg.max_positions:
            raise ValueError(f"{N} positions; the model has {self.cfg.max_positions}")
        pos = torch.arange(N, device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(pos)[None]
        opts = AttentionOptions(mask=key_padding_mask(attention_mask), causal=True, dk_scale=dk_scale)
        x, attn = self.blocks(x, opts, dk_layers=dk_layers, output_attentions=output_attentions, hooks=hooks)
        return ModelOutput(hidden=self.final_layer_norm(x), attentions=attn)
