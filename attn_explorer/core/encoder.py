"""BERT-style text encoders (BERT, MiniLM, RoBERTa, DistilBERT, ELECTRA): learned positions and post-LN blocks.

DistilBERT has no token types (type_vocab_size=0); ELECTRA's embeddings may be narrower than its
blocks (embed_dim), with a linear projection up to dim after the embedding LayerNorm.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attn_explorer.core.attention import AttentionOptions
from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.hooks import Hooks


@dataclass
class EncoderConfig:
    vocab_size: int = 30522  # word-piece vocabulary
    dim: int = 768  # hidden size D
    num_layers: int = 12  # L
    num_heads: int = 12  # H
    mlp_hidden: int = 3072  # feed-forward width
    max_positions: int = 512  # rows in the learned position table
    type_vocab_size: int = 2  # segment (token type) embeddings; RoBERTa has 1, DistilBERT none (0)
    eps: float = 1e-12  # LayerNorm epsilon
    act: str = "gelu"
    pad_token_id: int = 0
    position_offset: int = 0  # RoBERTa counts positions from pad_token_id + 1
    pooler: bool = False  # a dense+tanh head on the first token (loaded when the checkpoint has it)
    embed_dim: int | None = None  # embedding width (ELECTRA's embedding_size); None: dim. Another width is
    #                               projected to dim after the embedding LayerNorm (embeddings_project)

    @property
    def usable_positions(self) -> int:
        """The longest input, special tokens included."""
        return self.max_positions - self.position_offset


class Embeddings(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        width = cfg.embed_dim or cfg.dim
        self.word = nn.Embedding(cfg.vocab_size, width)
        self.position = nn.Embedding(cfg.max_positions, width)
        self.token_type = nn.Embedding(cfg.type_vocab_size, width) if cfg.type_vocab_size else None
        self.norm = nn.LayerNorm(width, eps=cfg.eps)
        self.project = nn.Linear(width, cfg.dim) if width != cfg.dim else None

    def forward(self, ids, position_ids, token_type_ids):
        x = self.word(ids) + self.position(position_ids)
        if self.token_type is not None:  # a model without token types reads none (DistilBERT)
            x = x + self.token_type(token_type_ids)
        x = self.norm(x)
        return x if self.project is None else self.project(x)


class TextEncoder(nn.Module):
    causal = False

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.blocks = BlockStack(
            [
                TransformerBlock(BlockConfig(cfg.dim, cfg.num_heads, cfg.mlp_hidden, norm_first=False, act=cfg.act, eps=cfg.eps), i)
                for i in range(cfg.num_layers)
            ]
        )
        self.pooler = nn.Linear(cfg.dim, cfg.dim) if cfg.pooler else None

    def position_ids(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.cfg.position_offset:
            # RoBERTa: real tokens count 1, 2, 3... after the padding index; padding keeps padding_idx.
            m = attention_mask.long()
            return torch.cumsum(m, dim=1) * m + self.cfg.pad_token_id
        return torch.arange(ids.shape[1], device=ids.device).expand_as(ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        dk_scale: float = 1.0,
        dk_layers=None,
        output_attentions: bool = False,
        hooks: Hooks | None = None,
    ) -> ModelOutput:
        """input_ids (B, N); attention_mask (B, N) with 1 for real tokens, 0 for padding.
        hooks: named hook points (core.hooks; see BlockStack.forward)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, self.position_ids(input_ids, attention_mask), token_type_ids)
        # (B, 1, 1, N): padding keys get no weight. Without padding there is nothing to mask.
        key_mask = None if bool(attention_mask.all()) else attention_mask.bool()[:, None, None, :]
        x, attn = self.blocks(x, AttentionOptions(mask=key_mask, dk_scale=dk_scale), dk_layers=dk_layers,
                              output_attentions=output_attentions, hooks=hooks)
        return ModelOutput(hidden=x, attentions=attn)
