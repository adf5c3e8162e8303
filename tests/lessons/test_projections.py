"""Lesson projections: Q, K, V, the pattern and the output are core's MultiHeadAttention's, with the
lesson's matrices, and agree with the primer's formulas written out in NumPy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_explorer.core.attention import AttentionOptions, MultiHeadAttention
from attn_explorer.errors import UserError
from attn_explorer.lessons.projections import project, random_weights, word_vectors


def numpy_attention(x, w):
    q, k, v = x @ w.w_q, x @ w.w_k, x @ w.w_v
    s = q @ k.T / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return q, k, v, p, p @ v


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_numbers_are_the_formulas(seed):
    words, x = word_vectors("the cat sat down")
    w = random_weights(seed)
    p = project(x, w)
    q, k, v, pat, out = numpy_attention(x, w)
    for got, want in ((p.q, q), (p.k, k), (p.v, v), (p.pattern, pat), (p.output, out)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert p.output.shape == x.shape == (4, 4)
    np.testing.assert_allclose(p.pattern.sum(1), 1.0)


def test_numbers_equal_a_core_module_built_here_with_the_same_weights():
    _, x = word_vectors("a dog ran home fast")
    w = random_weights(3)
    m = MultiHeadAttention(4, 1, qkv_bias=False, out_bias=False).double()
    with torch.no_grad():
        m.query.weight.copy_(torch.tensor(w.w_q).T)
        m.key.weight.copy_(torch.tensor(w.w_k).T)
        m.value.weight.copy_(torch.tensor(w.w_v).T)
        m.out.weight.copy_(torch.eye(4, dtype=torch.float64))
        out, probs = m(torch.tensor(x)[None], AttentionOptions(need_weights=True))
    p = project(x, w)
    np.testing.assert_allclose(p.output, out[0].numpy(), rtol=1e-12)
    np.testing.assert_allclose(p.pattern, probs[0, 0].numpy(), rtol=1e-12)


def test_reroll_changes_the_weights_and_a_seed_repeats_them():
    a, b = random_weights(0), random_weights(1)
    assert not np.allclose(a.w_q, b.w_q)
    np.testing.assert_array_equal(random_weights(0).w_k, a.w_k)


def test_words_give_fixed_vectors_and_bad_input_is_one_line():
    words, x = word_vectors("The cat, the CAT")
    assert words == ["The", "cat", ",", "the", "CAT"]
    np.testing.assert_array_equal(x[1], x[4])  # same word, same vector
    with pytest.raises(UserError, match="type a few words"):
        word_vectors("   ")
    with pytest.raises(UserError, match="4 numbers"):
        project(np.ones((2, 3)), random_weights(0))
