"""Lesson page "order": the shuffle check and the sinusoidal heatmaps on screen."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt

from attn_explorer.lessons import order

LESSON, SIZE = "order", (900, 700)


def test_page_shows_the_pure_numbers_and_shuffle_updates_them(page, qtbot, settle):
    want = order.shuffle_check(order.DEFAULT_TEXT, seed=0)
    assert page.check.perm == want.perm
    assert f"{want.diff_nopos:.1e}" in page.nopos_label.text()
    assert f"{want.diff_pos:.3g}" in page.pos_label.text()
    assert "untrained" in page.nopos_label.text() and "untrained" in page.pos_label.text()
    old = page.order_label.text()
    qtbot.mouseClick(page.shuffle_btn, Qt.LeftButton)
    settle(page)
    again = order.shuffle_check(order.DEFAULT_TEXT, seed=1)
    assert page.check.perm == again.perm != want.perm
    assert page.order_label.text() != old and str(again.perm[0]) in page.order_label.text()
    assert f"{again.diff_pos:.3g}" in page.pos_label.text()
    assert page.check.diff_nopos < 1e-5 and page.check.diff_pos > 1e-3


def test_editing_the_sentence_reruns_and_bad_input_clears(page, settle):
    page.text.setText("dogs chase cats")
    page.text.editingFinished.emit()
    settle(page)
    assert page.check.words == ["dogs", "chase", "cats"]
    assert "dogs" in page.order_label.text()
    page.text.setText("alone")
    page.text.editingFinished.emit()
    settle(page)
    assert page.check is None
    assert "two words" in page.message.text()
    assert page.order_label.text() == "" and page.nopos_label.text() == "" and page.pos_label.text() == ""
    page.text.setText("back to two")
    page.text.editingFinished.emit()
    settle(page)
    assert page.message.text() == "" and page.check.words == ["back", "to", "two"]


def test_heatmaps_follow_the_spin_boxes(page, settle):
    np.testing.assert_array_equal(page.table_img.image, order.encoding_table(50, 64))
    page.positions.setValue(20)
    page.dims.setValue(16)
    settle(page)
    assert page.table_img.image.shape == (20, 16)
    np.testing.assert_allclose(page.sim_img.image, order.position_similarity(20, 16))
    assert "20 positions × 16 dimensions" in page.encoding_note.text()
    assert "= 8.0 = d/2" in page.encoding_note.text()
