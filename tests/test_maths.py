"""attn_explorer.maths: the one copy of entropy, "hide special tokens" and the colour scales."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer import maths


def _rows(n: int, seed: int = 0, lead=(2, 3)) -> np.ndarray:
    a = np.random.default_rng(seed).random((*lead, n, n)).astype(np.float32)
    return a / a.sum(-1, keepdims=True)


def test_entropy_is_log2_n_for_uniform_rows_and_zero_for_one_key():
    for n in (1, 2, 7, 512):
        np.testing.assert_allclose(maths.entropy_bits(np.full((3, n), 1 / n)), np.log2(n), atol=1e-5)
    e = maths.entropy_bits(np.eye(5))
    assert np.all(e == 0) and not np.any(np.signbit(e))  # no -0.0
    # two keys at 1/2: one bit, whatever the axis
    np.testing.assert_allclose(maths.entropy_bits(np.array([[0.5, 0.5], [0.5, 0.5]]), axis=0), [1.0, 1.0])


def test_renormalise_without_drops_columns_and_rescales_rows():
    rows = np.array([[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]], np.float32)
    out = maths.renormalise_without(rows, [True, False, False])
    np.testing.assert_allclose(out, [[0.5, 0.5], [0.0, 0.0]])  # a row left with nothing stays zeros, not NaN
    assert np.isfinite(out).all()


def test_hide_specials_drops_rows_and_columns_and_rows_sum_to_one():
    a = _rows(6)
    special = np.array([1, 0, 0, 0, 0, 1], bool)
    out = maths.without_specials(a, special)
    assert out.shape == (2, 3, 4, 4)
    np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-6)
    expect = a[..., 1:5, 1:5] / a[..., 1:5, 1:5].sum(-1, keepdims=True)
    np.testing.assert_allclose(out, expect, rtol=1e-6)


@pytest.mark.parametrize("special", [np.zeros(5, bool), np.ones(5, bool), None])
def test_hide_specials_changes_nothing_when_none_or_all_are_special(special):
    a = _rows(5)
    assert maths.hidden_tokens(special) is None
    assert maths.without_specials(a, special if special is not None else np.zeros(5, bool)) is a
    rows = a[:, :, 2, :]
    assert maths.rows_without_specials(rows, special) is rows
    np.testing.assert_array_equal(maths.kept_tokens(special, 5), np.arange(5))


def test_one_query_row_hidden_is_that_row_of_the_hidden_map():
    a = _rows(7, seed=4)
    special = np.array([1, 0, 0, 1, 0, 0, 0], bool)
    kept = maths.kept_tokens(special, 7)
    np.testing.assert_array_equal(kept, [1, 2, 4, 5, 6])
    np.testing.assert_array_equal(maths.kept_tokens(special, 7, hide=False), np.arange(7))
    whole = maths.without_specials(a, special)
    for row, q in enumerate(kept):
        np.testing.assert_allclose(maths.rows_without_specials(a[..., q, :], special), whole[..., row, :], rtol=1e-6)


def test_log_scale_is_floored_and_leveled():
    values, levels = maths.display_values(np.array([1.0, 0.1, 1e-7, 0.0]), log=True)
    np.testing.assert_allclose(values, [0.0, -1.0, maths.LOG_FLOOR, maths.LOG_FLOOR], atol=1e-6)
    assert levels == (maths.LOG_FLOOR, 0.0) and np.isfinite(values).all()
    a = np.array([0.2, 0.8])
    values, levels = maths.display_values(a, log=False)
    np.testing.assert_array_equal(values, a)
    assert levels == (0.0, 1.0)


def test_clipped_levels_come_from_the_data_not_from_the_largest_cell():
    # a rollout-like map at 512 tokens: a strong diagonal, everything else near 1/512
    n = 512
    rng = np.random.default_rng(1)
    m = rng.random((n, n)).astype(np.float32) * 2 / n
    m[np.arange(n), np.arange(n)] = 0.5
    values, (lo, hi), top = maths.clipped_values(m, log=False)
    assert lo == 0.0 and hi == top
    assert top < 0.01 < float(m.max())  # the diagonal (0.2% of the cells) saturates; the rest spans the colours
    share_dark = float((values < 0.1 * hi).mean())
    assert share_dark < 0.2  # not "nearly uniform dark": with levels (0, max) over 90% would be
    assert float((m < 0.1 * m.max()).mean()) > 0.9
    lv, (llo, lhi), _ = maths.clipped_values(m, log=True)
    assert lhi == pytest.approx(np.log10(top)) and llo == pytest.approx(lhi - maths.LOG_DECADES)
    assert np.isfinite(lv).all() and lv.min() >= llo - 1e-6
    assert "99th" in maths.clipped_label("rollout", False) and "log" in maths.clipped_label("rollout", True)


def test_clipped_levels_of_an_empty_or_zero_map_are_never_zero_wide():
    for m in (np.zeros((3, 3)), np.zeros((0,))):
        _, (lo, hi), top = maths.clipped_values(m, log=False)
        assert hi > lo and top > 0
