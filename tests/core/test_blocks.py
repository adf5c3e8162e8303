"""Blocks and grouped-query attention against explicit per-head references."""
from __future__ import annotations

import math

import pytest
import torch

from attn_explorer.core.attention import AttentionOptions, MultiHeadAttention
from attn_explorer.api.hooks import caching_hook, heads_first, merge
from attn_explorer.core.blocks import BlockConfig, BlockStack, TransformerBlock
from attn_explorer.core.hooks import Hooks


@pytest.mark.parametrize("mlp_bias,attn_out_bias", [(False, True), (True, False), (False, False), (True, True)])
def test_attention_output_bias_has_its_own_flag(mlp_bias, attn_out_bias):
    """mlp_bias used to switch W_O's bias too: a block without MLP biases lost its attention bias."""
    block = TransformerBlock(BlockConfig(16, 2, 32, mlp_bias=mlp_bias, attn_out_bias=attn_out_bias))
    assert (block.attn.out.bias is not None) == attn_out_bias
    assert (block.mlp.fc1.bias is not None) == mlp_bias and (block.mlp.fc2.bias is not None) == mlp_bias
    swiglu = TransformerBlock(BlockConfig(16, 2, 32, mlp="swiglu", mlp_bias=mlp_bias, attn_out_bias=attn_out_bias))
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


def _keep_all(store: dict, layers) -> Hooks:
    """Hooks that keep q, k, v and z of the given layers in store[name]."""
    return Hooks(merge({f"blocks.{i}.attn.hook_{p}": caching_hook(store) for i in layers for p in "qkvz"}))


def test_hooks_hold_per_head_q_k_v_that_give_the_attention():
    torch.manual_seed(0)
    stack = BlockStack([TransformerBlock(BlockConfig(24, 3, 40), i) for i in range(3)]).eval()
    x = torch.randn(2, 6, 24)
    caps: dict = {}
    with torch.no_grad():
        _, att = stack(x, AttentionOptions(dk_scale=1.7), output_attentions=True, hooks=_keep_all(caps, range(3)))
        only: dict = {}
        _, none = stack(x, AttentionOptions(dk_scale=1.7), hooks=_keep_all(only, [1]))
    assert len(caps) == 3 * 4 and none is None
    assert sorted(only) == sorted(f"blocks.1.attn.hook_{p}" for p in "qkvz")
    for i in range(3):
        a = f"blocks.{i}.attn."
        assert caps[a + "hook_q"].shape == caps[a + "hook_k"].shape == caps[a + "hook_v"].shape == (2, 6, 3, 8)
        assert caps[a + "hook_z"].shape == (2, 6, 3, 8)
        q, k, v = (heads_first(caps[a + p], 3) for p in ("hook_q", "hook_k", "hook_v"))  # (B, H, N, d)
        want = torch.softmax(q @ k.transpose(-1, -2) * 1.7 / math.sqrt(8), dim=-1)
        torch.testing.assert_close(att[:, i], want, atol=1e-5, rtol=0)
        # z is each head's weighted sum of the values, before W_O
        torch.testing.assert_close(heads_first(caps[a + "hook_z"], 3), att[:, i] @ v, atol=1e-5, rtol=0)
    w_o = stack.layers[1].attn.out.weight.view(24, 3, 8)

    def head_outputs(z):  # (B, N, H, d) -> each head's output after W_O, (B, H, N, D)
        return torch.einsum("bhnd,ehd->bhne", heads_first(z, 3), w_o)

    for p in "qkvz":  # one layer asked for, the same numbers
        name = f"blocks.1.attn.hook_{p}"
        torch.testing.assert_close(only[name], caps[name], atol=1e-5, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(head_outputs(only["blocks.1.attn.hook_z"]), head_outputs(caps["blocks.1.attn.hook_z"]),
                                   atol=1e-5, rtol=0)
