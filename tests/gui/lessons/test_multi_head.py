"""The multi-head page: one pattern per head beside the single head's, Concat, W_O and the output."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.lessons.multi_head import split_heads
from attn_explorer.lessons.projections import random_weights, word_vectors

LESSON, SIZE = "multi-head", (1200, 900)


def shown(table) -> np.ndarray:
    return np.array([[float(t) for t in row] for row in table.texts()])


@pytest.mark.parametrize("index,h", [(0, 1), (1, 2), (2, 4)])
def test_each_head_count_shows_the_module_numbers(page, settle, index, h):
    page.heads.setCurrentIndex(index)
    settle(page)
    _, x = word_vectors("the cat sat down")
    mh = split_heads(x, random_weights(0), h)
    assert len(page.pattern_tables) == h
    for i, t in enumerate(page.pattern_tables):
        np.testing.assert_allclose(shown(t), mh.patterns[i], atol=5e-4)
        np.testing.assert_allclose(shown(t).sum(1), 1.0, atol=3e-3)
        np.testing.assert_allclose(shown(page.head_out_tables[i]), mh.head_outputs[i], atol=5e-3)
    np.testing.assert_allclose(shown(page.single), mh.single_pattern, atol=5e-4)
    np.testing.assert_allclose(shown(page.concat), mh.concat, atol=5e-3)
    np.testing.assert_allclose(shown(page.output), mh.output, atol=5e-3)
    assert page.concat.columnCount() == 4


def test_edit_and_reroll_update(page, settle):
    _, x = word_vectors("the cat sat down")
    page.x_table.set_cell(2, 0, "1.5")
    x[2, 0] = 1.5
    page.reroll.click()
    settle(page)
    mh = split_heads(x, random_weights(1), 2)
    np.testing.assert_allclose(shown(page.output), mh.output, atol=5e-3)
    np.testing.assert_allclose(shown(page.w_o), random_weights(1).w_o, atol=5e-3)
    assert "seed 1" in page.w_o_box.title.text()
    page.x_table.set_cell(0, 0, "")
    settle(page)
    assert "empty cell" in page.message.text()
    np.testing.assert_allclose(shown(page.output), mh.output, atol=5e-3)
