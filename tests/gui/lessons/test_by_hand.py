"""The by-hand lesson page: its numbers are the pure module's, edits update them, bad cells do not crash."""
from __future__ import annotations

import math

import numpy as np

from attn_explorer.lessons import by_hand

LESSON, SIZE = "by-hand", (700, 600)


def shown(table) -> np.ndarray:
    return np.array([[float(t) if t else np.nan for t in row] for row in table.texts()])


def test_page_shows_the_primer_exercise(page):
    steps = shown(page.step_table)
    w = np.exp([4 / math.sqrt(2), 0, 2 / math.sqrt(2)])
    np.testing.assert_allclose(steps[:3, 3], w / w.sum(), atol=5e-4)  # 3 decimals on screen
    np.testing.assert_allclose(steps[:3, 0], [4, 0, 2])
    assert page.step_table.item(3, 3).text() == "1.000"  # the weights' sum
    ref = by_hand.attend_by_hand(by_hand.DEFAULT_QUERY, by_hand.DEFAULT_KEYS, by_hand.DEFAULT_VALUES)
    np.testing.assert_allclose(shown(page.out_table)[0], ref.output, atol=5e-4)


def test_editing_a_cell_updates_every_step(page, settle):
    page.keys.set_cell(1, 1, "-1")  # k2 = [0, -1]: its score stays 0; change k3 instead
    page.query.set_cell(0, 1, "1")  # q = [2, 1]
    settle(page)
    ref = by_hand.attend_by_hand([[2, 1]], [[2, 0], [0, -1], [1, 1]], by_hand.DEFAULT_VALUES)
    np.testing.assert_allclose(shown(page.step_table)[:3, 0], [4, -1, 3])
    np.testing.assert_allclose(shown(page.step_table)[:3, 3], ref.weights, atol=5e-4)
    page.temperature.setValue(2.0)
    settle(page)
    ref2 = by_hand.attend_by_hand([[2, 1]], [[2, 0], [0, -1], [1, 1]], by_hand.DEFAULT_VALUES, 2.0)
    np.testing.assert_allclose(shown(page.step_table)[:3, 3], ref2.weights, atol=5e-4)
    assert "2 / √2" in page.scale_line.text()


def test_letters_in_a_cell_give_one_line_and_keep_the_last_numbers(page, settle):
    before = page.step_table.texts()
    page.keys.set_cell(0, 0, "abc")
    settle(page)
    assert "row 1, column 1: 'abc' is not a number" in page.message.text()
    assert "\n" not in page.message.text()
    assert page.step_table.texts() == before
    page.keys.set_cell(0, 0, "2")
    settle(page)
    assert page.message.text() == ""


def test_add_and_remove_tokens(page, settle):
    page.add_btn.click()
    settle(page)
    assert page.keys.rowCount() == page.values.rowCount() == 4
    assert page.step_table.rowCount() == 5  # 4 keys and the sums
    page.keys.set_cell(3, 0, "5")
    settle(page)
    assert shown(page.step_table)[3, 0] == 10.0
    page.remove_btn.click()
    page.remove_btn.click()
    settle(page)
    assert page.keys.rowCount() == 2 and page.step_table.rowCount() == 3


def test_dimension_spin_adds_columns(page, settle):
    page.d_k.setValue(3)
    assert page.query.columnCount() == page.keys.columnCount() == 3
    page.query.set_cell(0, 2, "1")
    page.keys.set_cell(2, 2, "4")
    settle(page)
    np.testing.assert_allclose(shown(page.step_table)[:3, 0], [4, 0, 6])
    assert "√3" in page.scale_line.text()


def test_show_the_pytorch_shows_the_core_source(page):
    assert not page.code.isVisible()
    page.show_code.setChecked(True)
    assert page.code.isVisible()
    assert "def scaled_dot_product_attention(" in page.code.toPlainText()
