"""The projections page shows the pure module's numbers and follows edits, words and re-rolls."""
from __future__ import annotations

import numpy as np

from attn_explorer.lessons.projections import project, random_weights, word_vectors

LESSON, SIZE = "projections", (1200, 800)


def shown(table) -> np.ndarray:
    return np.array([[float(t) for t in row] for row in table.texts()])


def assert_page_is(page, x, seed):
    w = random_weights(seed)
    p = project(x, w)
    np.testing.assert_allclose(shown(page.w_tables["q"]), w.w_q, atol=5e-3)
    for key, m in (("q", p.q), ("k", p.k), ("v", p.v)):
        np.testing.assert_allclose(shown(page.qkv_tables[key]), m, atol=5e-3)
    np.testing.assert_allclose(shown(page.pattern), p.pattern, atol=5e-4)
    np.testing.assert_allclose(shown(page.output), p.output, atol=5e-3)
    np.testing.assert_allclose(page.result.output, p.output)


def test_page_shows_the_default_words(page):
    words, x = word_vectors("the cat sat down")
    assert page.tokens() == words
    assert_page_is(page, x, 0)
    assert "4×4; the output is 4×4: the same shape" in page.shapes.text()


def test_edit_reroll_and_new_words_update_the_numbers(page, settle):
    _, x = word_vectors("the cat sat down")
    page.x_table.set_cell(1, 2, "3")
    settle(page)
    x[1, 2] = 3.0
    assert_page_is(page, x, 0)
    page.reroll.click()
    settle(page)
    assert page.seed.value() == 1 and "seed 1" in page.w_boxes["q"].title.text()
    assert_page_is(page, x, 1)
    page.words.setText("dogs bark loudly")
    page.words.editingFinished.emit()
    settle(page)
    words, x2 = word_vectors("dogs bark loudly")
    assert page.tokens() == words and page.pattern.rowCount() == 3
    assert_page_is(page, x2, 1)


def test_bad_cell_keeps_the_last_numbers(page, settle):
    before = page.output.texts()
    page.x_table.set_cell(0, 0, "x1")
    settle(page)
    assert "X, row 1, column 1: 'x1' is not a number" in page.message.text()
    assert page.output.texts() == before
