"""Llama (and SmolLM2, which is one): a causal decoder built from our parts.

Pre-norm blocks with RMSNorm, rotary positions (RoPE) on q and k, grouped-query attention (fewer
key/value heads than query heads), a SwiGLU MLP, a final RMSNorm and a language-model head that may
share the token embedding's matrix ("tied embeddings").

For generation the forward takes a `KVCache`: the new tokens' keys and values are appended to the
cached ones, so each step runs one token through the stack and attends to everything before it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.attention import AttentionOptions, KVCache, decoder_start, key_padding_mask
from attn_explorer.core.blocks import BlockStack, TransformerBlock
from attn_explorer.core.layers import RMSNorm
from attn_explorer.core.linear import Linear
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.positional import rope_tables


@dataclass
class LlamaConfig:
    vocab_size: int = 49152
    dim: int = 576  # hidden_size
    num_layers: int = 30  # num_hidden_layers
    num_heads: int = 9  # num_attention_heads (query heads)
    num_kv_heads: int = 3  # num_key_value_heads: query head h reads key/value head h // (H / H_kv)
    mlp_hidden: int = 1536  # intermediate_size
    max_positions: int = 8192  # max_position_embeddings
    eps: float = 1e-5  # rms_norm_eps
    rope_theta: float = 100000.0  # the base of RoPE's frequencies
    tie_embeddings: bool = True  # tie_word_embeddings: the LM head is the token embedding
    head: bool = True  # False: saved untied without its LM head (a bare LlamaModel): attention, no generation
    attention_bias: bool = False  # biases on q, k, v and W_O
    mlp_bias: bool = False

    @property
    def usable_positions(self) -> int:
        return self.max_positions

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads


class Llama(nn.Module):
    causal = True

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = BlockStack(
            [
                TransformerBlock(
                    cfg.dim, cfg.num_heads, cfg.mlp_hidden, norm_first=True, eps=cfg.eps, norm="rms",
                    mlp="swiglu", qkv_bias=cfg.attention_bias, attn_out_bias=cfg.attention_bias,
                    mlp_bias=cfg.mlp_bias, num_kv_heads=cfg.num_kv_heads,
                )
                for _ in range(cfg.num_layers)
            ]
        )
        self.norm = RMSNorm(cfg.dim, eps=cfg.eps)
        # Tied: no matrix of its own; `logits` multiplies by the embedding. Untied without a head: none.
        untied_head = not cfg.tie_embeddings and cfg.head
        self.lm_head = Linear(cfg.dim, cfg.vocab_size, bias=False) if untied_head else None
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None  # (cos, sin) for positions 0..n-1

    def rope(self, start: int, n: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's (cos, sin) for positions start..start+n-1, each (n, head_dim); the table is
        computed once for the longest length seen and sliced after."""
        end = start + n
        t = self._rope
        if t is None or t[0].shape[0] < end or t[0].device != device or t[0].dtype != dtype:
            size = max(end, 64 if t is None else 2 * t[0].shape[0])
            t = self._rope = rope_tables(size, self.cfg.head_dim, self.cfg.rope_theta, device=device, dtype=dtype)
        return t[0][start:end], t[1][start:end]

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.num_layers)

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
        """input_ids (B, N): the new tokens. With a cache they sit at positions past..past+N-1 and
        attend to the cached tokens too; attention_mask (B, past + N), 1 = a real token."""
        N = input_ids.shape[1]
        past = decoder_start(cache, N, self.cfg.max_positions)
        x = self.embed_tokens(input_ids)
        opts = AttentionOptions(mask=key_padding_mask(attention_mask), causal=True, dk_scale=dk_scale,
                                rope=self.rope(past, N, x.device, x.dtype))
        x, attn = self.blocks(x, opts, dk_layers=dk_layers, output_attentions=output_attentions,
                              captures=captures, cache=cache)
        return ModelOutput(hidden=self.norm(x), attentions=attn)

    @property
    def can_generate(self) -> bool:
        """Whether there is an LM head: its own, or the embedding (tied)."""
        return self.cfg.tie_embeddings or self.cfg.head

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits (..., vocab) from the final hidden states."""
        if self.cfg.tie_embeddings:
            return F.linear(hidden, self.embed_tokens.weight)
        if self.lm_head is None:
            raise RuntimeError("this Llama was loaded without its LM head: it has no next-token logits")
        return self.lm_head(hidden)
