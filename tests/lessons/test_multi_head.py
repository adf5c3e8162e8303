"""Lesson multi-head: h heads, Concat and W_O are core's MultiHeadAttention(dim=4, num_heads=h)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_explorer.core.attention import AttentionOptions, MultiHeadAttention
from attn_explorer.errors import UserError
from attn_explorer.lessons.multi_head import split_heads
from attn_explorer.lessons.projections import random_weights, word_vectors


def core_module(w, h):
    m = MultiHeadAttention(4, h, qkv_bias=False, out_bias=False).double()
    with torch.no_grad():
        for lin, mat in ((m.query, w.w_q), (m.key, w.w_k), (m.value, w.w_v), (m.out, w.w_o)):
            lin.weight.copy_(torch.tensor(mat).T)
    return m


@pytest.mark.parametrize("h", [1, 2, 4])
def test_result_equals_core_multi_head_attention(h):
    _, x = word_vectors("the cat sat on the mat")
    w = random_weights(5)
    mh = split_heads(x, w, h)
    with torch.no_grad():
        out, probs = core_module(w, h)(torch.tensor(x)[None], AttentionOptions(need_weights=True))
    np.testing.assert_allclose(mh.output, out[0].numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(mh.patterns, probs[0].numpy(), rtol=1e-12)
    assert mh.patterns.shape == (h, 6, 6) and mh.d_k == 4 // h
    np.testing.assert_allclose(mh.patterns.sum(-1), 1.0)
    np.testing.assert_allclose(mh.concat @ w.w_o, mh.output, atol=1e-12)


def test_each_head_uses_its_own_slice():
    _, x = word_vectors("one two three")
    w = random_weights(2)
    mh = split_heads(x, w, 2)
    q, k, v = x @ w.w_q, x @ w.w_k, x @ w.w_v
    for i in range(2):
        sl = slice(2 * i, 2 * i + 2)
        s = q[:, sl] @ k[:, sl].T / np.sqrt(2)
        p = np.exp(s) / np.exp(s).sum(1, keepdims=True)
        np.testing.assert_allclose(mh.patterns[i], p, rtol=1e-10)
        np.testing.assert_allclose(mh.head_outputs[i], p @ v[:, sl], rtol=1e-10)
        np.testing.assert_allclose(mh.concat[:, sl], mh.head_outputs[i])
    np.testing.assert_allclose(split_heads(x, w, 1).patterns[0], mh.single_pattern)


def test_uneven_split_is_refused():
    _, x = word_vectors("a b")
    with pytest.raises(UserError, match="1, 2 or 4"):
        split_heads(x, random_weights(0), 3)
