"""The primer's model, followed exactly: word vectors + sinusoidal positions, pre-LN blocks,
seeded random projections. Untrained: it exists to show the mechanics, not language.

Each word gets a fixed random vector drawn from a generator seeded by the word itself, so the same
word always gets the same vector, and no vocabulary or tokenizer file is needed.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import torch
from torch import nn

from attn_explorer.core.attention import AttentionOptions
from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.positional import sinusoidal_positions
from attn_explorer.core.hooks import Hooks


@dataclass
class TextbookConfig:
    dim: int = 64  # d_model
    num_layers: int = 2
    num_heads: int = 4
    mlp_hidden: int = 256
    max_positions: int = 512
    positional: bool = True  # False drops the sinusoidal table: attention is then permutation-equivariant
    seed: int = 0  # seeds every projection

    @property
    def usable_positions(self) -> int:
        return self.max_positions


def split_words(text: str) -> list[str]:
    """Words and punctuation marks, the primer's notion of a token."""
    return re.findall(r"\w+(?:'\w+)?|[^\w\s]", text)


def word_vector(word: str, dim: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(word.lower().encode("utf-8")))
    return torch.randn(dim, generator=g)


class TextbookTransformer(nn.Module):
    causal = False

    def __init__(self, cfg: TextbookConfig):
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):  # seeded projections, without touching the caller's RNG
            torch.manual_seed(cfg.seed)
            self.blocks = BlockStack(
                [TransformerBlock(BlockConfig(cfg.dim, cfg.num_heads, cfg.mlp_hidden, norm_first=True, eps=1e-5), i)
                 for i in range(cfg.num_layers)]
            )
        self.norm = nn.LayerNorm(cfg.dim)
        self.register_buffer("pe", sinusoidal_positions(cfg.max_positions, cfg.dim), persistent=False)

    def embed(self, words: list[str]) -> torch.Tensor:
        """(1, N, D) word vectors, plus positions when the config has them."""
        x = torch.stack([word_vector(w, self.cfg.dim) for w in words])[None].to(self.pe.device, self.pe.dtype)
        if self.cfg.positional:
            x = x + self.pe[: x.shape[1]]
        return x

    def forward(
        self,
        x: torch.Tensor,
        dk_scale: float = 1.0,
        dk_layers=None,
        output_attentions: bool = False,
        hooks: Hooks | None = None,
        **_,
    ) -> ModelOutput:
        """x: (B, N, D) embedded input (see embed)."""
        x, attn = self.blocks(x, AttentionOptions(dk_scale=dk_scale), dk_layers=dk_layers,
                              output_attentions=output_attentions, hooks=hooks)
        return ModelOutput(hidden=self.norm(x), attentions=attn)
