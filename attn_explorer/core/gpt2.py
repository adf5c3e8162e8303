"""GPT-2: a causal decoder with learned positions, pre-LN blocks and a fused QKV projection."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.attention import AttentionOptions, KVCache, decoder_start, key_padding_mask
from attn_explorer.core.blocks import BlockStack, TransformerBlock
from attn_explorer.core.linear import Linear
from attn_explorer.core.output import ModelOutput


@dataclass
class GPT2Config:
    vocab_size: int = 50257
    dim: int = 768  # n_embd
    num_layers: int = 12  # n_layer
    num_heads: int = 12  # n_head
    mlp_hidden: int = 3072  # n_inner, 4 * dim by default
    max_positions: int = 1024  # n_positions
    eps: float = 1e-5  # layer_norm_epsilon
    act: str = "gelu_tanh"  # gelu_new
    tie_embeddings: bool = True  # tie_word_embeddings: the LM head is the token embedding (GPT-2 as released)
    head: bool = True  # False: saved untied without its LM head (a bare GPT2Model): attention, no generation

    @property
    def usable_positions(self) -> int:
        return self.max_positions


class GPT2(nn.Module):
    causal = True

    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.dim)
        self.blocks = BlockStack(
            [
                TransformerBlock(
                    cfg.dim, cfg.num_heads, cfg.mlp_hidden, norm_first=True, act=cfg.act, eps=cfg.eps, fused_qkv=True
                )
                for _ in range(cfg.num_layers)
            ]
        )
        self.ln_f = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        untied_head = not cfg.tie_embeddings and cfg.head
        self.lm_head = Linear(cfg.dim, cfg.vocab_size, bias=False) if untied_head else None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        dk_scale: float = 1.0,
        dk_layers=None,
        output_attentions: bool = False,
        captures: list | dict | None = None,
        cache: KVCache | None = None,
        **_,
    ) -> ModelOutput:
        """cache: the new tokens sit after the cached ones (positions past..past+N-1) and attend to them too."""
        N = input_ids.shape[1]
        past = decoder_start(cache, N, self.cfg.max_positions)
        pos = torch.arange(past, past + N, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)[None]
        opts = AttentionOptions(mask=key_padding_mask(attention_mask), causal=True, dk_scale=dk_scale)
        x, attn = self.blocks(x, opts, dk_layers=dk_layers,
                              output_attentions=output_attentions, captures=captures, cache=cache)
        return ModelOutput(hidden=self.ln_f(x), attentions=attn)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.num_layers)

    @property
    def can_generate(self) -> bool:
        """Whether there is an LM head: the embedding (tied, as released), or its own."""
        return self.cfg.tie_embeddings or self.cfg.head

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits (..., vocab): GPT-2's LM head is the token embedding (tied), unless the
        checkpoint has its own."""
        if self.cfg.tie_embeddings:
            return F.linear(hidden, self.wte.weight)
        if self.lm_head is None:
            raise RuntimeError("this GPT-2 was loaded without its LM head: it has no next-token logits")
        return self.lm_head(hidden)
