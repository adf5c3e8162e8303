"""Lesson page "order": the shuffle check and the sinusoidal heatmaps on screen."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from attn_explorer.lessons import order
from attn_explorer.session.state import SessionState


@pytest.fixture
def page(qtbot):
    from attn_explorer.gui.lessons.order import LessonPage

    state = SessionState(device="cpu")
    p = LessonPage(state)
    qtbot.addWidget(p)
    p.resize(900, 700)
    p.show()
    yield p
    state.shutdown()


def test_page_shows_the_pure_numbers_and_shuffle_updates_them(page, qtbot):
    want = order.shuffle_check(order.DEFAULT_TEXT, seed=0)
    assert page.check.perm == want.perm
    assert f"{want.diff_nopos:.1e}" in page.nopos_label.text()
    assert f"{want.diff_pos:.3g}" in page.pos_label.text()
    assert "untrained" in page.nopos_label.text() and "untrained" in page.pos_label.text()
    old = page.order_label.text()
    qtbot.mouseClick(page.shuffle_btn, Qt.LeftButton)
    again = order.shuffle_check(order.DEFAULT_TEXT, seed=1)
    assert page.check.perm == again.perm != want.perm
    assert page.order_label.text() != old and str(again.perm[0]) in page.order_label.text()
    assert f"{again.diff_pos:.3g}" in page.pos_label.text()
    assert page.check.diff_nopos < 1e-5 and page.check.diff_pos > 1e-3


def test_editing_the_sentence_reruns_and_bad_input_clears(page, qtbot):
    page.text.setText("dogs chase cats")
    page.text.editingFinished.emit()
    assert page.check.words == ["dogs", "chase", "cats"]
    assert "dogs" in page.order_label.text()
    page.text.setText("alone")
    page.text.editingFinished.emit()
    assert page.check is None
    assert "two words" in page.message.text()
    assert page.order_label.text() == "" and page.nopos_label.text() == "" and page.pos_label.text() == ""
    page.text.setText("back to two")
    page.text.editingFinished.emit()
    assert page.message.text() == "" and page.check.words == ["back", "to", "two"]


def test_heatmaps_follow_the_spin_boxes(page):
    np.testing.assert_array_equal(page.table_img.image, order.encoding_table(50, 64))
    page.positions.setValue(20)
    page.dims.setValue(16)
    assert page.table_img.image.shape == (20, 16)
    np.testing.assert_allclose(page.sim_img.image, order.position_similarity(20, 16))
    assert "20 positions × 16 dimensions" in page.encoding_note.text()
    assert "= 8.0 = d/2" in page.encoding_note.text()
