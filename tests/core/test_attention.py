"""The attention maths on plain tensors: what a student could check by hand."""
from __future__ import annotations

import math

import pytest
import torch

from attn_explorer.api.hooks import caching_hook, heads_first, merge
from attn_explorer.core.attention import AttentionOptions, MultiHeadAttention, scaled_dot_product_attention
from attn_explorer.core.hooks import Hooks
from attn_explorer.core.positional import apply_rope, rope_tables, sinusoidal_positions
from attn_explorer.core.textbook import TextbookConfig, TextbookTransformer, split_words


def test_primer_by_hand_example():
    """q = [2, 0]; keys [2,0], [0,3], [1,1]: logits 4, 0, 2 divided by sqrt(2)."""
    q = torch.tensor([[2.0, 0.0]])
    k = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    v = torch.eye(3)
    out, probs = scaled_dot_product_attention(q, k, v)
    logits = torch.tensor([4.0, 0.0, 2.0]) / math.sqrt(2)
    expected = torch.exp(logits) / torch.exp(logits).sum()
    torch.testing.assert_close(probs[0], expected)
    torch.testing.assert_close(out[0], expected)  # V = I: the output is the weights
    assert probs[0].argmax() == 0  # the key most like the query wins


def test_rows_sum_to_one_and_masks():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    _, p = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 3, 5))
    keep = torch.tensor([True, True, False, True, False])
    _, pb = scaled_dot_product_attention(q, k, v, mask=keep)
    assert pb[..., ~keep].abs().max() == 0
    additive = torch.zeros(5).masked_fill(~keep, float("-inf"))
    _, pa = scaled_dot_product_attention(q, k, v, mask=additive)
    torch.testing.assert_close(pa, pb)
    _, pc = scaled_dot_product_attention(q, k, v, causal=True)
    assert torch.triu(pc, diagonal=1).abs().max() == 0
    torch.testing.assert_close(pc.sum(-1), torch.ones(2, 3, 5))


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = torch.randn(1, 3, 4), torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    out, p = scaled_dot_product_attention(q, k, v, mask=mask)
    assert not torch.isnan(out).any() and not torch.isnan(p).any()
    assert p[0, 1].abs().sum() == 0 and out[0, 1].abs().sum() == 0
    # causal with fewer keys than queries: the first queries have no key at all
    out, p = scaled_dot_product_attention(torch.randn(5, 4), torch.randn(3, 4), torch.randn(3, 4), causal=True)
    assert not torch.isnan(out).any() and p[:2].abs().sum() == 0 and out[:2].abs().sum() == 0
    torch.testing.assert_close(p[2:].sum(-1), torch.ones(3))


def test_dk_scale_limits():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    _, flat = scaled_dot_product_attention(q, k, v, dk_scale=1e-6)
    torch.testing.assert_close(flat, torch.full_like(flat, 1 / 6), atol=1e-5, rtol=0)
    _, sharp = scaled_dot_product_attention(q, k, v, dk_scale=1e4)
    logits = q @ k.transpose(-1, -2)
    onehot = torch.nn.functional.one_hot(logits.argmax(-1), 6).float()
    torch.testing.assert_close(sharp, onehot, atol=1e-4, rtol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_mha_fast_path_matches_explicit(fused):
    torch.manual_seed(0)
    mha = MultiHeadAttention(24, 3, fused_qkv=fused).eval()
    x = torch.randn(2, 7, 24)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 5:] = False
    for causal in (False, True):
        slow, probs = mha(x, AttentionOptions(mask=mask, causal=causal, dk_scale=0.7, need_weights=True))
        fast, none = mha(x, AttentionOptions(mask=mask, causal=causal, dk_scale=0.7))
        assert none is None and probs.shape == (2, 3, 7, 7)
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=0)


def test_mha_hook_z_head_outputs_sum_to_output():
    """Each head's share after W_O (hook_z through its slice of W_O), summed over heads plus the bias, is the
    module's output."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(1, 5, 16)
    cap = {}
    hooks = Hooks(merge({f"blocks.0.attn.hook_{p}": caching_hook(cap) for p in "vz"}))
    out, _ = mha(x, AttentionOptions(hooks=hooks.layer(0)))
    assert cap["blocks.0.attn.hook_v"].shape == cap["blocks.0.attn.hook_z"].shape == (1, 5, 4, 4)  # (B, N, H, d)
    ctx = heads_first(cap["blocks.0.attn.hook_z"], 4)  # (B, H, N, d)
    w_o = mha.out.weight.view(16, 4, 4)  # (D, H, d)
    head_outputs = torch.einsum("bhnd,ehd->bhne", ctx, w_o)  # (B, H, N, D)
    torch.testing.assert_close(head_outputs.sum(1) + mha.out.bias, out, atol=1e-5, rtol=0)


def test_grouped_query_attention_shapes():
    mha = MultiHeadAttention(32, 8, num_kv_heads=2, fused_qkv=True)
    out, p = mha(torch.randn(1, 6, 32), AttentionOptions(need_weights=True))
    assert out.shape == (1, 6, 32) and p.shape == (1, 8, 6, 6)


def test_rope_preserves_norm_and_relative_dot():
    cos, sin = rope_tables(10, 8)
    x = torch.randn(1, 1, 10, 8)
    torch.testing.assert_close(apply_rope(x, (cos, sin)).norm(dim=-1), x.norm(dim=-1))
    q, k = torch.randn(8), torch.randn(8)
    def dot(i, j):
        qi = apply_rope(q.expand(1, 1, 10, 8), (cos, sin))[0, 0, i]
        kj = apply_rope(k.expand(1, 1, 10, 8), (cos, sin))[0, 0, j]
        return qi @ kj
    torch.testing.assert_close(dot(3, 1), dot(7, 5), atol=1e-5, rtol=0)  # only the offset matters


def test_sinusoidal_table():
    pe = sinusoidal_positions(50, 16)
    assert pe.shape == (50, 16)
    torch.testing.assert_close(pe[0, 0::2], torch.zeros(8))
    torch.testing.assert_close(pe[0, 1::2], torch.ones(8))
    assert len({tuple(r.round(decimals=4).tolist()) for r in pe}) == 50  # every position distinct


def test_textbook_permutation_equivariance():
    """Without positions, shuffling the words shuffles the attention the same way; with them, not."""
    words = split_words("the cat sat on the warm mat today")
    perm = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])
    shuffled = [words[i] for i in perm]
    for positional, equivariant in ((False, True), (True, False)):
        m = TextbookTransformer(TextbookConfig(positional=positional)).eval()
        with torch.no_grad():
            a = m(m.embed(words), output_attentions=True).attentions[0]
            b = m(m.embed(shuffled), output_attentions=True).attentions[0]
        permuted = a[:, :, perm][:, :, :, perm]
        assert torch.allclose(permuted, b, atol=1e-5) == equivariant


def test_textbook_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = TextbookTransformer(TextbookConfig())
    after = torch.rand(1)
    b = TextbookTransformer(TextbookConfig())
    assert torch.equal(before, after)
    for (n1, p1), (_, p2) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p1, p2), n1
