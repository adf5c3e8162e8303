"""Attention rollout on hand-built attention, where the answer is known."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.analysis.rollout import attention_rollout, discard_lowest, fuse_heads, rollout_layers
from attn_explorer.errors import UserError


def random_attention(L=3, H=4, N=7, seed=0):
    a = np.random.default_rng(seed).random((L, H, N, N)) ** 3
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)


def test_identity_attention_rolls_out_to_the_identity():
    eye = np.broadcast_to(np.eye(6, dtype=np.float32), (4, 3, 6, 6))
    for fusion in ("mean", "max", "min"):
        np.testing.assert_allclose(attention_rollout(eye, fusion), np.eye(6), atol=1e-7)
        np.testing.assert_allclose(attention_rollout(eye, fusion, discard_ratio=0.9), np.eye(6), atol=1e-7)


def test_rollout_is_the_residual_aware_product_and_rows_sum_to_one():
    a = random_attention()
    want = np.eye(7)
    for l in range(3):
        step = 0.5 * a[l].mean(0) + 0.5 * np.eye(7)
        want = (step / step.sum(-1, keepdims=True)) @ want
    got = attention_rollout(a)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
    layers = rollout_layers(a)
    np.testing.assert_allclose(layers[-1], got)
    np.testing.assert_allclose(attention_rollout(a, upto=0), layers[0])


def test_one_uniform_layer_is_half_uniform_half_identity():
    n = 5
    u = np.full((1, 2, n, n), 1 / n, dtype=np.float32)
    np.testing.assert_allclose(attention_rollout(u), 0.5 / n + 0.5 * np.eye(n), atol=1e-6)


def test_fusions_take_the_heads_mean_max_min():
    a = random_attention(L=1)[0]
    np.testing.assert_allclose(fuse_heads(a, "max"), a.max(0))
    np.testing.assert_allclose(fuse_heads(a, "min"), a.min(0))
    assert not np.allclose(attention_rollout(a[None], "max"), attention_rollout(a[None], "min"))


def test_discard_drops_the_lowest_weights_but_never_a_tokens_own():
    m = np.arange(16, dtype=np.float64).reshape(4, 4) + 1  # the diagonal holds 1, 6, 11, 16
    out = discard_lowest(m, 0.25)  # 4 of 16 weights go: the lowest off-diagonal ones, 2, 3, 4, 5
    assert np.all(np.diag(out) == np.diag(m))
    dropped = np.argwhere(out == 0)
    assert sorted(m[tuple(dropped.T)].tolist()) == [2, 3, 4, 5]
    everything = discard_lowest(m, 0.99)
    assert np.all(everything[~np.eye(4, dtype=bool)] == 0) and np.all(np.diag(everything) > 0)


@pytest.mark.parametrize("bad", [-0.1, 1.0, "x"])
def test_bad_discard_ratio_is_one_line(bad):
    with pytest.raises(UserError, match="discard ratio"):
        attention_rollout(random_attention(), discard_ratio=bad)


def test_bad_shapes_and_layers_are_one_line():
    with pytest.raises(UserError, match="shaped"):
        attention_rollout(np.zeros((3, 3)))
    with pytest.raises(UserError, match="layer 5 does not exist"):
        attention_rollout(random_attention(), upto=5)
    with pytest.raises(UserError, match="head fusion"):
        attention_rollout(random_attention(), "median")
