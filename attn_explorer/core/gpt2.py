"""GPT-2 and OPT: causal decoders with learned absolute positions and LayerNorm blocks.

One model, chosen by config fields: GPT-2 (fused QKV in one projection, positions from row 0) and OPT
(separate q/k/v projections, a position table offset by 2 rows, ReLU MLP; OPT-350m also has post-LN
blocks without a final norm and token embeddings narrower than the blocks, projected in and out).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.attention import AttentionOptions, KVCache, decoder_start, key_padding_mask
from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock
from attn_explorer.core.linear import Linear
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.hooks import Hooks


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
    fused_qkv: bool = True  # one (dim -> 3*dim) projection (GPT-2's c_attn); False: q, k, v apart (OPT)
    position_offset: int = 0  # OPT: position p reads row p + 2 of the learned table (it has max_positions + 2 rows)
    embed_dim: int | None = None  # token embedding width (OPT's word_embed_proj_dim); None: dim. Another width
    #                               is projected in to dim before the blocks and back out after them
    norm_first: bool = True  # pre-LN blocks; False: post-LN (OPT-350m's do_layer_norm_before=false)
    final_norm: bool = True  # a LayerNorm after the last block (ln_f); OPT-350m has none
    bias: bool = True  # biases on the attention and MLP projections (OPT's enable_bias)

    @property
    def usable_positions(self) -> int:
        return self.max_positions


class GPT2(nn.Module):
    causal = True

    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.cfg = cfg
        embed = cfg.embed_dim or cfg.dim
        self.wte = nn.Embedding(cfg.vocab_size, embed)
        self.wpe = nn.Embedding(cfg.max_positions + cfg.position_offset, cfg.dim)
        self.project_in = Linear(embed, cfg.dim, bias=False) if embed != cfg.dim else None
        self.blocks = BlockStack(
            [
                TransformerBlock(BlockConfig(
                    cfg.dim, cfg.num_heads, cfg.mlp_hidden, norm_first=cfg.norm_first, act=cfg.act, eps=cfg.eps,
                    fused_qkv=cfg.fused_qkv, qkv_bias=cfg.bias, mlp_bias=cfg.bias, attn_out_bias=cfg.bias,
                ), i)
                for i in range(cfg.num_layers)
            ]
        )
        self.ln_f = nn.LayerNorm(cfg.dim, eps=cfg.eps) if cfg.final_norm else None
        self.project_out = Linear(cfg.dim, embed, bias=False) if embed != cfg.dim else None
        untied_head = not cfg.tie_embeddings and cfg.head
        self.lm_head = Linear(embed, cfg.vocab_size, bias=False) if untied_head else None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        dk_scale: float = 1.0,
        dk_layers=None,
        output_attentions: bool = False,
        hooks: Hooks | None = None,
        cache: KVCache | None = None,
        **_,
    ) -> ModelOutput:
        """cache: the new tokens sit after the cached ones (positions past..past+N-1) and attend to them too.
        hidden: after the final norm, and projected back to the embedding width where OPT has project_out."""
        N = input_ids.shape[1]
        past = decoder_start(cache, N, self.cfg.max_positions)
        pos = torch.arange(past, past + N, device=input_ids.device) + self.cfg.position_offset
        x = self.wte(input_ids)
        if self.project_in is not None:
            x = self.project_in(x)
        x = x + self.wpe(pos)[None]
        opts = AttentionOptions(mask=key_padding_mask(attention_mask), causal=True, dk_scale=dk_scale)
        x, attn = self.blocks(x, opts, dk_layers=dk_layers,
                              output_attentions=output_attentions, hooks=hooks, cache=cache)
        if self.ln_f is not None:
            x = self.ln_f(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return ModelOutput(hidden=x, attentions=attn)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.num_layers)

    @property
    def can_generate(self) -> bool:
        """Whether there is an LM head: the embedding (tied, as released), or its own."""
        return self.cfg.tie_embeddings or self.cfg.head

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits (..., vocab) from `forward`'s hidden: GPT-2's and OPT's LM head is the token
        embedding (tied), unless the checkpoint has its own."""
        if self.cfg.tie_embeddings:
            return F.linear(hidden, self.wte.weight)
        if self.lm_head is None:
            raise RuntimeError("this decoder was loaded without its LM head: it has no next-token logits")
        return self.lm_head(hidden)
