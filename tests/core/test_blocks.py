"""Blocks and grouped-query attention against explicit per-head references."""
from __future__ import annotations

import math

import pytest
import torch

from attn_explorer.core.attention import AttentionOptions, MultiHeadAttention
from attn_explorer.core.blocks import BlockStack, TransformerBlock


@pytest.mark.parametrize("mlp_bias,attn_out_bias", [(False, True), (True, False), (False, False), (True, True)])
def test_attention_output_bias_has_its_own_flag(mlp_bias, attn_out_bias):
    """mlp_bias used to switch W_O's bias too: a block without MLP biases lost its attention bias."""
    block = TransformerBlock(16, 2, 32, mlp_bias=mlp_bias, attn_out_bias=attn_out_bias)
    assert (block.attn.out.bias is not None) == attn_out_bias
    assert (block.mlp.fc1.bias is not None) == mlp_bias and (block.mlp.fc2.bias is not None) == mlp_bias
    swiglu = TransformerBlock(16, 2, 32, mlp="swiglu", mlp_bias=mlp_bias, attn_out_bias=attn_out_bias)
    assert (swiglu.attn.out.bias is not None) == attn_out_bias and (swiglu.mlp.down.bias is not None) == mlp_bias


def _per_head_reference(mha: MultiHeadAttention, x: torch.Tensor, causal: bool):
    """Each query head h uses key/value head h // (H / H_kv), written out one head at a time."""
    H, H_kv, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    W, b = mha.qkv.weight, mha.qkv.bias
    q_all = x @ W[: H * d].T + b[: H * d]  # (N, H*d)
    k_all = x @ W[H * d: (H + H_kv) * d].T + b[H * d: (H + H_kv) * d]  # (N, H_kv*d)
    v_all = x @ W[(H + H_kv) * d:].T + b[(H + H_kv) * d:]
    N = x.shape[0]
    probs, outs = [], []
    for h in range(H):
        g = h // (H // H_kv)
        q = q_all[:, h * d:(h + 1) * d]
        k = k_all[:, g * d:(g + 1) * d]
        v = v_all[:, g * d:(g + 1) * d]
        s = q @ k.T / math.sqrt(d)
        if causal:
            s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
        p = torch.softmax(s, dim=-1)
        probs.append(p)
        outs.append(p @ v)
    out = torch.cat(outs, dim=-1) @ mha.out.weight.T + mha.out.bias
    return out, torch.stack(probs)


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (6, 3), (4, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_matches_per_head_reference(heads, kv_heads, causal):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8 * heads, heads, num_kv_heads=kv_heads, fused_qkv=True).eval()
    x = torch.randn(1, 7, 8 * heads)
    want_out, want_probs = _per_head_reference(mha, x[0], causal)
    with torch.no_grad():
        out, probs = mha(x, AttentionOptions(causal=causal, need_weights=True))
        fast, _ = mha(x, AttentionOptions(causal=causal))
    torch.testing.assert_close(probs[0], want_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(out[0], want_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast[0], want_out, atol=1e-5, rtol=0)


def test_captures_hold_per_head_q_k_v_that_give_the_attention():
    torch.manual_seed(0)
    stack = BlockStack([TransformerBlock(24, 3, 40) for _ in range(3)]).eval()
    x = torch.randn(2, 6, 24)
    caps: list = []
    with torch.no_grad():
        _, att = stack(x, AttentionOptions(dk_scale=1.7), output_attentions=True, captures=caps)
        only: dict = {1: {}}
        _, none = stack(x, AttentionOptions(dk_scale=1.7), captures=only)
    assert len(caps) == 3 and none is None
    for i, cap in enumerate(caps):
        assert cap["q"].shape == cap["k"].shape == cap["values"].shape == (2, 3, 6, 8)
        want = torch.softmax(cap["q"] @ cap["k"].transpose(-1, -2) * 1.7 / math.sqrt(8), dim=-1)
        torch.testing.assert_close(att[:, i], want, atol=1e-5, rtol=0)
    for name in ("q", "k", "values", "head_outputs"):  # one layer asked for, the same numbers
        torch.testing.assert_close(only[1][name], caps[1][name], atol=1e-5, rtol=0)
