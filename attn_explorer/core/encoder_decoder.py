"""Encoder-decoder transformers (BART): the original Transformer's two stacks.

The encoder reads the source text with full self-attention. Each decoder layer has three sub-layers:
causal self-attention over the target tokens, cross-attention (query = a target token, keys and
values = the encoder's output, one per source token), and the MLP. BART is post-LN throughout:
    x = LN(x + SelfAttn(x));  x = LN(x + CrossAttn(x, memory));  x = LN(x + MLP(x))
Positions are learned tables whose rows start at position_offset (2 in BART), and a LayerNorm
(layernorm_embedding) follows each stack's embeddings.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import math
import torch
from torch import nn

from attn_explorer.core.attention import AttentionOptions, MultiHeadAttention, key_padding_mask
from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock
from attn_explorer.core.layers import MLP
from attn_explorer.core.output import ModelOutput
from attn_explorer.core.hooks import Hooks


@dataclass
class EncoderDecoderConfig:
    vocab_size: int = 50265
    dim: int = 768  # d_model
    num_layers: int = 6  # encoder_layers (ModelInfo's L is the encoder's)
    num_heads: int = 12  # encoder_attention_heads
    mlp_hidden: int = 3072  # encoder_ffn_dim
    decoder_layers: int = 6
    decoder_heads: int = 12  # decoder_attention_heads
    decoder_mlp_hidden: int = 3072  # decoder_ffn_dim
    max_positions: int = 1024  # max_position_embeddings: the tables have position_offset more rows
    position_offset: int = 2  # BART's learned positions start at row 2
    eps: float = 1e-5  # LayerNorm epsilon (BART keeps torch's default)
    act: str = "gelu"  # activation_function
    scale_embedding: bool = False  # token embeddings times sqrt(dim)
    pad_token_id: int = 1
    decoder_start_token_id: int = 2  # what the decoder reads first (BART: </s>)

    @property
    def usable_positions(self) -> int:
        return self.max_positions


@dataclass
class EncoderDecoderOutput(ModelOutput):
    """ModelOutput's hidden and attentions are the encoder's; the decoder's come beside them."""

    decoder_hidden: torch.Tensor | None = None  # (B, T, D) the decoder's last hidden state
    decoder_attentions: torch.Tensor | None = None  # (B, L_dec, H, T, T) causal self-attention
    cross_attentions: torch.Tensor | None = None  # (B, L_dec, H, T, S): target token t looks at source token s


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention onto the encoder's output, MLP; post-LN (BART)."""

    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, act: str = "gelu", eps: float = 1e-5):
        super().__init__()
        self.self_attn = MultiHeadAttention(dim, num_heads)
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.cross_attn = MultiHeadAttention(dim, num_heads)
        self.norm_cross = nn.LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, mlp_hidden, act)
        self.norm2 = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor, self_opts: AttentionOptions, cross_opts: AttentionOptions):
        """Returns (x, self-attention probs or None, cross-attention probs or None)."""
        a, self_probs = self.self_attn(x, self_opts)
        x = self.norm1(x + a)
        c, cross_probs = self.cross_attn(x, cross_opts)
        x = self.norm_cross(x + c)
        x = self.norm2(x + self.mlp(x))
        return x, self_probs, cross_probs


class Stack(nn.Module):
    """One side's token positions and embedding LayerNorm (the token table itself is shared)."""

    def __init__(self, cfg: EncoderDecoderConfig):
        super().__init__()
        self.embed_positions = nn.Embedding(cfg.max_positions + cfg.position_offset, cfg.dim)
        self.embed_norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)


class EncoderDecoder(nn.Module):
    causal = False  # what `attentions` holds: the encoder's, which sees the whole source
    encoder_decoder = True
    can_generate = False  # no generation loop for encoder-decoders yet

    def __init__(self, cfg: EncoderDecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)  # BART's `shared`, both stacks read it
        self.encoder = Stack(cfg)
        self.encoder.blocks = BlockStack(
            [TransformerBlock(BlockConfig(cfg.dim, cfg.num_heads, cfg.mlp_hidden, norm_first=False, act=cfg.act, eps=cfg.eps), i)
             for i in range(cfg.num_layers)]
        )
        self.decoder = Stack(cfg)
        self.decoder.layers = nn.ModuleList(
            DecoderBlock(cfg.dim, cfg.decoder_heads, cfg.decoder_mlp_hidden, cfg.act, cfg.eps)
            for _ in range(cfg.decoder_layers)
        )

    def _embed(self, stack: Stack, ids: torch.Tensor) -> torch.Tensor:
        N = ids.shape[1]
        if N > self.cfg.max_positions:
            raise ValueError(f"{N} positions; the model has {self.cfg.max_positions}")
        scale = math.sqrt(self.cfg.dim) if self.cfg.scale_embedding else 1.0
        pos = torch.arange(N, device=ids.device) + self.cfg.position_offset
        return stack.embed_norm(self.embed_tokens(ids) * scale + stack.embed_positions(pos)[None])

    def shift_right(self, ids: torch.Tensor) -> torch.Tensor:
        """The decoder's input for target ids: the start token, then the target without its last token
        (so position t predicts target token t)."""
        start = torch.full_like(ids[:, :1], self.cfg.decoder_start_token_id)
        return torch.cat([start, ids[:, :-1]], dim=1)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        dk_scale: float = 1.0,
        dk_layers=None,
        output_attentions: bool = False,
        hooks: Hooks | None = None,
        **_,
    ) -> EncoderDecoderOutput:
        """input_ids (B, S) the source; decoder_input_ids (B, T), by default the source shifted right
        (as transformers' BartModel does). Masks: 1 = a real token. dk_scale applies to the layers in
        dk_layers of both stacks (all when None). hooks: the encoder's named hook points (core.hooks)."""
        src_mask = key_padding_mask(attention_mask)
        x = self._embed(self.encoder, input_ids)
        memory, enc_attn = self.encoder.blocks(
            x, AttentionOptions(mask=src_mask, dk_scale=dk_scale), dk_layers=dk_layers,
            output_attentions=output_attentions, hooks=hooks,
        )
        if decoder_input_ids is None:
            decoder_input_ids = self.shift_right(input_ids)
        y = self._embed(self.decoder, decoder_input_ids)
        layers = None if dk_layers is None else set(int(i) for i in dk_layers)
        self_opts = AttentionOptions(mask=key_padding_mask(decoder_attention_mask), causal=True,
                                     need_weights=output_attentions)
        cross_opts = AttentionOptions(mask=src_mask, memory=memory, need_weights=output_attentions)
        self_maps, cross_maps = [], []
        for i, block in enumerate(self.decoder.layers):
            dk = dk_scale if layers is None or i in layers else 1.0
            y, s, c = block(y, replace(self_opts, dk_scale=dk), replace(cross_opts, dk_scale=dk))
            self_maps.append(s)
            cross_maps.append(c)
        stack = (lambda maps: torch.stack(maps, dim=1)) if output_attentions else (lambda maps: None)
        return EncoderDecoderOutput(hidden=memory, attentions=enc_attn, decoder_hidden=y,
                                    decoder_attentions=stack(self_maps), cross_attentions=stack(cross_maps))
