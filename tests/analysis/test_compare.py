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
    assert "\n" not in msg and msg == ("cannot compare: A has 16 tokens and B has 15; the maps are subtracted token "
                                       "by token, so B needs 1 more (for example, change one word)")
    heads = mismatch(np.zeros((6, 12, 4, 4)), np.zeros((4, 4, 4, 4)), names=("A (the Text box)", "B"))
    assert heads == ("cannot compare: A (the Text box)'s model has 6 layers of 12 heads and B's has 4 layers of "
                     "4 heads; heads can only be paired between models of the same size")
    assert "×" not in heads  # plain words, no shapes


def test_different_tokens_of_the_same_length_are_a_note_not_a_refusal():
    a = np.zeros((1, 1, 3, 3))
    note = mismatch(a, a, ["[CLS]", "tired", "[SEP]"], ["[CLS]", "wide", "[SEP]"])
    assert note.startswith("note") and "token 1" in note and "'tired'" in note
    assert mismatch(a, a, ["x"] * 3, ["x"] * 3) == ""
