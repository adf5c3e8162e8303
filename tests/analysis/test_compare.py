"""The signed difference of two runs, and the one line when they cannot be compared."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.analysis.compare import attention_diff, mismatch
from attn_explorer.errors import UserError


def test_the_difference_is_b_minus_a_and_antisymmetric():
    rng = np.random.default_rng(1)
    a, b = rng.random((2, 3, 5, 5)), rng.random((2, 3, 5, 5))
    d = attention_diff(a, b)
    np.testing.assert_allclose(d, b - a, atol=1e-6)
    np.testing.assert_array_equal(attention_diff(b, a), -d)
    assert not np.any(attention_diff(a, a))


def test_different_shapes_say_why_in_one_line():
    a, b = np.zeros((6, 12, 16, 16)), np.zeros((6, 12, 15, 15))
    with pytest.raises(UserError) as e:
        attention_diff(a, b)
    msg = str(e.value)
    assert "\n" not in msg and "6×12×16×16" in msg and "6×12×15×15" in msg and "query tokens: 16 vs 15" in msg
    assert "heads: 12 vs 6" in mismatch(np.zeros((6, 12, 4, 4)), np.zeros((6, 6, 4, 4)))


def test_different_tokens_of_the_same_length_are_a_note_not_a_refusal():
    a = np.zeros((1, 1, 3, 3))
    note = mismatch(a, a, ["[CLS]", "tired", "[SEP]"], ["[CLS]", "wide", "[SEP]"])
    assert note.startswith("note") and "token 1" in note and "'tired'" in note
    assert mismatch(a, a, ["x"] * 3, ["x"] * 3) == ""
