"""Lesson by-hand: the primer's exercise 1 worked by our core."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attn_explorer.core.attention import scaled_dot_product_attention
from attn_explorer.errors import UserError
from attn_explorer.lessons import by_hand


def hand_softmax(xs):
    e = [math.exp(x) for x in xs]
    return [x / sum(e) for x in e]


def test_primer_exercise_weights():
    s = by_hand.attend_by_hand(by_hand.DEFAULT_QUERY, by_hand.DEFAULT_KEYS, by_hand.DEFAULT_VALUES)
    np.testing.assert_allclose(s.scores, [4, 0, 2])
    np.testing.assert_allclose(s.scaled, [4 / math.sqrt(2), 0, 2 / math.sqrt(2)])
    np.testing.assert_allclose(s.weights, hand_softmax([4 / math.sqrt(2), 0, 2 / math.sqrt(2)]), rtol=1e-12)
    assert s.weights.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(s.exps / s.total, s.weights, rtol=1e-12)
    values = np.array(by_hand.DEFAULT_VALUES)
    np.testing.assert_allclose(s.output, s.weights @ values, rtol=1e-12)


def test_temperature_multiplies_the_scale_as_core_does():
    q, k, v = np.array([[1.0, -2.0, 0.5]]), np.random.default_rng(0).normal(size=(5, 3)), np.eye(5)
    s = by_hand.attend_by_hand(q, k, v, temperature=3.0)
    assert s.scale == pytest.approx(3.0 / math.sqrt(3))
    out, probs = scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(v), dk_scale=3.0)
    np.testing.assert_allclose(s.weights, probs[0].numpy())
    np.testing.assert_allclose(s.output, out[0].numpy())


def test_large_scores_are_shifted_before_exp_without_changing_weights():
    s = by_hand.attend_by_hand([[300.0, 0]], [[300.0, 0], [0, 1]], [[1.0], [0.0]])
    assert s.shift > 0 and np.isfinite(s.exps).all()
    np.testing.assert_allclose(s.exps / s.total, s.weights)


def test_parse_table_refuses_letters_with_one_line():
    assert by_hand.parse_table([["1", " -2.5 "]], "keys").tolist() == [[1.0, -2.5]]
    with pytest.raises(UserError, match=r"keys, row 2, column 1: 'abc' is not a number"):
        by_hand.parse_table([["1", "2"], ["abc", "3"]], "keys")
    with pytest.raises(UserError, match="empty cell"):
        by_hand.parse_table([[""]], "query")


def test_mismatched_shapes_are_user_errors():
    with pytest.raises(UserError, match="must match"):
        by_hand.attend_by_hand([[1.0, 2.0]], [[1.0, 2.0, 3.0]], [[1.0]])
    with pytest.raises(UserError, match="each key needs one value"):
        by_hand.attend_by_hand([[1.0, 2.0]], [[1.0, 2.0]], [[1.0], [2.0]])


def test_core_source_is_the_real_code():
    src = by_hand.core_source()
    assert "def scaled_dot_product_attention(" in src and "def attention_scale(" in src
    assert "torch.softmax" in src
