"""The inside-a-head page: the loaded model's own numbers, following the selection and the d_k slider,
and reachable by double-clicking a token in the explorer's views."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPointF, Qt

from attn_explorer.session.lessons import LESSONS


def open_page(window, qtbot):
    window.open_lesson("inside-a-head")
    page = window.pages["lessons"].pages["inside-a-head"]
    qtbot.waitUntil(lambda: page.trace is not None and page.body.isEnabled(), timeout=30000)
    return page


def shown_weights(page) -> dict[int, float]:
    """token index -> weight, as the table shows them (top keys only)."""
    out = {}
    for i in range(page.table.rowCount()):
        label = page.table.verticalHeaderItem(i).text()
        if label.isdigit():
            out[int(label)] = float(page.table.item(i, 4).text())
    return out


def assert_matches_result(page, state):
    r = state.result
    row = r.attentions[state.layer, state.head, state.query]
    t = page.trace
    assert (t.layer, t.head, t.query) == (state.layer, state.head, state.query)
    np.testing.assert_allclose(t.probs, row, atol=1e-6)
    for j, w in shown_weights(page).items():
        assert w == round(float(row[j]), 4) or abs(w - row[j]) < 6e-5
    top = np.argsort(-row)[: len(shown_weights(page))]
    assert set(shown_weights(page)) == set(int(j) for j in top)
    np.testing.assert_allclose(t.output, row.astype(np.float64) @ t.v, atol=1e-5)


def test_page_shows_the_selected_head_and_follows_dk(make_window, qtbot):
    window = make_window(model="minilm")
    state = window.state
    page = open_page(window, qtbot)
    assert_matches_result(page, state)
    assert f'"{state.result.tokens[state.query]}"' in page.header.text()
    assert "1.00 / √32" in page.header.text()
    page.table.setCurrentCell(2, 0)  # the learner clicks the third key
    j = int(page.table.verticalHeaderItem(2).text())
    assert f'of "{state.result.tokens[j]}"' in page.kv_line.text()
    assert f"= {page.trace.logits[j]:.3f}" in page.kv_line.text()
    before = page.trace
    state.set_dk_scale(4.0)
    qtbot.waitUntil(lambda: page.trace is not before and page.trace.dk_scale == 4.0
                    and state.result.dk_scale == 4.0 and page.body.isEnabled(), timeout=30000)
    assert_matches_result(page, state)
    assert "4.00 / √32" in page.header.text()
    state.select(layer=3, head=5)
    assert not page.body.isEnabled()  # the old numbers are greyed while the new trace runs
    qtbot.waitUntil(lambda: page.trace.layer == 3 and page.trace.head == 5 and page.body.isEnabled(), timeout=30000)
    assert_matches_result(page, state)
    assert page.layer_spin.value() == 3 and page.head_spin.value() == 5
    page.query_combo.setCurrentIndex(1)
    assert state.query == 1
    qtbot.waitUntil(lambda: page.trace.query == 1 and page.body.isEnabled(), timeout=30000)
    assert_matches_result(page, state)


def test_long_input_shows_top_keys_and_a_summary(make_window, qtbot):
    window = make_window(model="minilm", text="the cat sat on the mat and looked at the dog " * 4)
    page = open_page(window, qtbot)
    n = window.state.result.num_tokens
    labels = [page.table.verticalHeaderItem(i).text() for i in range(page.table.rowCount())]
    assert sum(lab.isdigit() for lab in labels) == 12
    rest = labels.index("…")
    assert page.table.item(rest, 0).text() == f"{n - 12} other keys"
    assert page.table.item(page.table.rowCount() - 1, 4).text() == "1.000"


def test_double_click_in_token_focus_opens_the_lesson(make_window, qtbot):
    window = make_window(model="minilm")
    window.show_page("tokens")
    strip = window.token_view.strip
    qtbot.waitUntil(lambda: strip.count() > 0, timeout=10000)
    item = strip.item(3)
    at = strip.visualItemRect(item).center()
    qtbot.mouseClick(strip.viewport(), Qt.LeftButton, pos=at)  # a real double-click: press, release, then this
    qtbot.mouseDClick(strip.viewport(), Qt.LeftButton, pos=at)
    assert window.current_page_name == "lessons"
    assert window.pages["lessons"].current_lesson == "inside-a-head"
    page = window.pages["lessons"].pages["inside-a-head"]
    qtbot.waitUntil(lambda: page.trace is not None and page.trace.query == 3, timeout=30000)
    assert window.state.query == 3


def test_double_click_in_one_head_opens_the_lesson_on_that_row(make_window, qtbot):
    window = make_window(model="minilm")
    window.show_page("head")
    hv = window.head_view
    qtbot.waitUntil(lambda: hv.matrix is not None, timeout=10000)

    class DoubleClick:
        def __init__(self, pos):
            self.pos = pos

        def double(self):
            return True

        def scenePos(self):  # noqa: N802
            return self.pos

    hv._clicked(DoubleClick(hv.plot.vb.mapViewToScene(QPointF(1.5, 5.5))))
    assert window.state.query == 5
    assert window.pages["lessons"].current_lesson == "inside-a-head"
    assert "inside-a-head" in LESSONS
