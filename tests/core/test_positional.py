"""RoPE against transformers' Llama rotary embedding, at several positions and bases."""
from __future__ import annotations

import pytest
import torch

from attn_explorer.core.positional import apply_rope, rope_tables

llama = pytest.importorskip("transformers.models.llama.modeling_llama")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("theta", [10000.0, 500000.0, 100.0])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_rope_matches_llama(theta, head_dim):
    heads = 2
    cfg = transformers.LlamaConfig(hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=heads,
                                   rope_theta=theta, max_position_embeddings=4096)
    rotary = llama.LlamaRotaryEmbedding(cfg)
    positions = torch.tensor([[0, 1, 2, 7, 63, 300, 2047]])
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, positions.shape[1], head_dim, generator=g)
    k = torch.randn(1, heads, positions.shape[1], head_dim, generator=g)
    cos, sin = rotary(q, positions)  # (1, N, d)
    want_q, want_k = llama.apply_rotary_pos_emb(q, k, cos, sin)
    table_cos, table_sin = rope_tables(2048, head_dim, base=theta)
    ours = (table_cos[positions[0]], table_sin[positions[0]])  # rows for these positions
    torch.testing.assert_close(apply_rope(q, ours), want_q, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(apply_rope(k, ours), want_k, atol=1e-4, rtol=1e-4)
