"""Lesson "Why divide by √d_k": the spread, entropy and gradient curves."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attn_explorer.core.attention import scaled_dot_product_attention
from attn_explorer.errors import UserError
from attn_explorer.lessons import scaling


@pytest.fixture(scope="module")
def curves():
    return scaling.scaling_curves(num_keys=16, num_queries=256, seed=0)


def test_unscaled_spread_grows_like_sqrt_dk_and_scaled_stays_near_one(curves):
    d = curves.dims.astype(float)
    assert d[0] == 4 and d[-1] == 1024
    assert 0.4 < scaling.loglog_slope(d, curves.spread.unscaled) < 0.6
    ratio = curves.spread.unscaled / np.sqrt(d)
    assert np.all((ratio > 0.75) & (ratio < 1.3))
    assert np.all((curves.spread.scaled > 0.8) & (curves.spread.scaled < 1.25))


def test_unscaled_softmax_saturates_and_scaled_does_not(curves):
    top = curves.max_entropy  # log2(16) = 4 bits
    assert curves.entropy.unscaled[-1] < 0.1 * top
    assert np.all(curves.entropy.scaled > 0.75 * top)
    assert curves.gradient.unscaled[-1] < 1e-3
    assert np.all(curves.gradient.scaled > 0.1)
    assert curves.gradient.unscaled[-1] < 1e-3 * curves.gradient.scaled[-1]


def test_weights_are_cores_and_gradient_is_the_softmax_jacobian(curves):
    assert curves.weights_agree < 1e-5
    g = torch.Generator().manual_seed(1)
    s, up = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    p, grad = scaling.softmax_gradient(s, up)
    ref = torch.stack([(torch.diag(pi) - torch.outer(pi, pi)) @ ui for pi, ui in zip(p, up)])
    torch.testing.assert_close(grad, ref.norm(dim=-1))


def test_the_lesson_has_no_entropy_of_its_own():
    from attn_explorer import maths

    assert scaling.entropy_bits is maths.entropy_bits  # the one NumPy copy


def test_first_point_equals_a_direct_computation():
    c = scaling.scaling_curves(dims=[8], num_keys=4, num_queries=3, seed=5)
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(3, 8, generator=g), torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
    _, p = scaled_dot_product_attention(q, k, v)
    assert c.spread.scaled[0] == pytest.approx(float((q @ k.T / math.sqrt(8)).std()), rel=1e-6)
    assert c.spread.unscaled[0] == pytest.approx(float((q @ k.T).std()), rel=1e-6)
    direct = -(p * torch.log2(p.clamp_min(1e-30))).sum(-1).mean()
    assert c.entropy.scaled[0] == pytest.approx(float(direct), rel=1e-6)


def test_bad_sizes_are_one_line():
    with pytest.raises(UserError):
        scaling.scaling_curves(num_keys=1)
