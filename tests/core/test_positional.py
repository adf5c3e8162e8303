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


@pytest.mark.parametrize("family", ["glm4", "cohere2", "deepseek_v3"])
@pytest.mark.parametrize("rotary", [16, 8])
def test_interleaved_layouts_match_transformers(family, rotary):
    """GLM-4 and Cohere rotate interleaved pairs (x_2i, x_2i+1) and keep that order; DeepSeek-V3 rotates them
    and hands the result back first members first. Partial rotary (8 of 16) keeps the rest as it is."""
    import importlib

    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    layout = "pairs_in" if family == "deepseek_v3" else "pairs"
    apply = mod.apply_rotary_pos_emb_interleave if family == "deepseek_v3" else mod.apply_rotary_pos_emb
    g = torch.Generator().manual_seed(3)
    head_dim, n = 16, 9
    q = torch.randn(1, 2, n, head_dim, generator=g)
    k = torch.randn(1, 2, n, head_dim, generator=g)
    cos, sin = rope_tables(n, rotary, base=100.0)
    if family == "cohere2":  # Cohere's tables repeat each frequency side by side: (f0, f0, f1, f1, ...)
        ref_cos, ref_sin = (t[:, :rotary // 2].repeat_interleave(2, dim=-1) for t in (cos, sin))
    else:
        ref_cos, ref_sin = cos, sin
    if rotary < head_dim:  # transformers' partial rotary: the first `rotary` dims go through RoPE
        want = [torch.cat([t, rest], -1) for t, rest in
                zip(apply(q[..., :rotary], k[..., :rotary], ref_cos[None], ref_sin[None]),
                    (q[..., rotary:], k[..., rotary:]))]
    else:
        want = apply(q, k, ref_cos[None], ref_sin[None])
    torch.testing.assert_close(apply_rope(q, (cos, sin), layout), want[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(apply_rope(k, (cos, sin), layout), want[1], atol=1e-6, rtol=1e-6)


def test_an_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="layout"):
        apply_rope(torch.zeros(1, 1, 2, 4), rope_tables(2, 4), "zigzag")
