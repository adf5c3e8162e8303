"""The analysis pages as a user meets them: each one draws the current result, and clicks lead to a head."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QFontMetrics, QMouseEvent

from tests.gui.conftest import sample

TEXT = "The animal didn't cross the street because it was too tired."


def _click_scene(qtbot, canvas, scene_pos):
    view_pt = canvas.mapFromScene(scene_pos)
    qtbot.mouseClick(canvas.viewport(), Qt.LeftButton, pos=QPoint(int(view_pt.x()), int(view_pt.y())))


def test_overview_shows_every_head_and_a_click_opens_one(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="overview")
    page = w.pages["overview"]
    qtbot.waitUntil(lambda: page.stats is not None, timeout=30000)
    r = w.state.result
    assert page.stats.prev.shape == (6, 12) and page.stats.prev[0, 2] == 1.0
    assert "L0 H2 attends most to the previous token in 100% of rows" in page.caption.text()
    np.testing.assert_array_equal(page.images["prev"].image, page.stats.prev.astype(np.float32))
    _click_scene(qtbot, page.canvas, page.cell_center("sink", 4, 9))
    qtbot.waitUntil(lambda: w.current_page_name == "head")
    assert (w.state.layer, w.state.head) == (4, 9) and (w.layer_spin.value(), w.head_spin.value()) == (4, 9)
    np.testing.assert_array_equal(w.head_view.matrix, r.attentions[4, 9])
    # the finding's link opens its head too: the previous-token head in one click
    w.show_page("overview")
    page.caption.linkActivated.emit("0,2")
    assert w.current_page_name == "head" and (w.state.layer, w.state.head) == (0, 2)


def test_overview_is_remeasured_for_a_new_input(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="overview")
    page = w.pages["overview"]
    qtbot.waitUntil(lambda: page.stats is not None, timeout=30000)
    first = page.stats
    w.state.set_text("Short one.")
    qtbot.waitUntil(lambda: page.stats is not None and page.stats is not first, timeout=30000)
    assert page._for is w.state.result and w.state.result.num_tokens == 5


def test_rollout_page_text_heatmap_and_image_overlay(make_window, qtbot, sample_path):
    w = make_window(model="minilm", text=TEXT, view="rollout")
    page = w.pages["rollout"]
    qtbot.waitUntil(lambda: page.shown is not None, timeout=30000)
    assert page.panel.plot.isVisible() and not page.picture.isVisible()
    np.testing.assert_allclose(page.shown.sum(-1), 1.0, atol=1e-4)
    before = page.shown.copy()
    page.fusion.setCurrentText("max")
    qtbot.waitUntil(lambda: page.shown is not None and not np.allclose(page.shown, before), timeout=30000)
    assert "fused by max" in page.caption.text()
    w.state.set_image(sample_path)
    qtbot.waitUntil(lambda: w.state.result is not None and w.state.result.grid is not None, timeout=60000)
    w.show_page("rollout")
    qtbot.waitUntil(lambda: page.picture.isVisible() and page.picture_img.image is not None, timeout=30000)
    assert "[CLS]" in page.caption.text() and page.picture_img.image.shape[:2] == w.state.result.image.shape[:2]


def test_norms_page_shows_raw_weights_beside_norms(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="norms")
    page = w.pages["norms"]
    qtbot.waitUntil(lambda: page.data is not None, timeout=30000)
    w.state.select(3, 1)
    np.testing.assert_array_equal(page.raw.matrix, w.state.result.attentions[3, 1])
    assert page.norm.matrix.shape == (16, 16) and np.all(page.norm.matrix >= 0)
    assert "L3 H1" in page.caption.text() and "on special tokens" in page.caption.text()


def test_search_finds_the_previous_token_head_and_opens_it(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="search")
    page = w.pages["search"]
    page.set_pattern("previous")
    qtbot.waitUntil(lambda: bool(page.ranked) and page.pattern.currentData() == "previous", timeout=30000)
    assert (page.ranked[0].layer, page.ranked[0].head) == (0, 2)
    assert page.ranking.item(0).text().startswith("L0 H2")
    page._picked(page.ranking.item(0))
    assert w.current_page_name == "head" and (w.state.layer, w.state.head) == (0, 2)
    w.show_page("search")
    page.set_pattern("pair", query="it", word="zebra")
    qtbot.waitUntil(lambda: "no token 'zebra'" in page.caption.text(), timeout=30000)
    assert page.ranked == [] and page.ranking.count() == 0  # no stale ranking under the message


def _said_once(page, text: str) -> bool:
    """`text` is on the page once: on the canvas, not repeated in the caption above it."""
    return page.stack.currentWidget() is page.stack.placeholder and text in page.stack.placeholder.text() \
        and text not in page.caption.text()


def test_compare_two_inputs_and_a_mismatch_in_one_line(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="compare")
    page = w.pages["compare"]
    qtbot.waitUntil(lambda: page.delta is not None, timeout=30000)
    b = page.result_b
    assert b.tokens[-3] == "wide"
    np.testing.assert_allclose(page.delta, b.attentions - w.state.result.attentions, atol=1e-6)
    l, h = w.state.layer, w.state.head
    np.testing.assert_allclose(page.diff.matrix, b.attentions[l, h] - w.state.result.attentions[l, h], atol=1e-6)
    page.b_input.setText("A much shorter one.")
    page.compare()
    qtbot.waitUntil(lambda: page.result_b is not None, timeout=30000)
    line = ("Cannot compare: A (the Text box) has 16 tokens and B has 7; the maps are subtracted token by token, "
            "so B needs 9 more (for example, change one word).")
    assert page.delta is None and _said_once(page, line)
    # another model with other heads: the same one line, naming what differs
    page.b_input.setText(TEXT)
    page.b_model.setText("textbook")
    page.compare()
    qtbot.waitUntil(lambda: page.result_b is not None, timeout=60000)
    assert page.result_b.model == "textbook"
    assert _said_once(page, "Cannot compare: A (the Text box)'s model has 6 layers of 12 heads and B's has")


def test_compare_waits_for_b_on_open_and_says_what_a_is(make_window, qtbot):
    """With a text of its own in the Text box, Compare does not run a B of another length and refuse it:
    it waits for B and says, once and in plain words, what A and B are."""
    errors = []
    w = make_window(model="minilm", text="Attention lets every token look at every other token in one step.")
    w.state.error_raised.connect(errors.append)
    page = w.pages["compare"]
    w.show_page("compare")
    qtbot.waitUntil(lambda: "A (the Text box)" in page.stack.placeholder.text(), timeout=10000)
    text = page.stack.placeholder.text()
    assert _said_once(page, "A (the Text box)") and "Press Compare" in text.replace("press", "Press")
    assert f"{w.state.result.num_tokens} tokens" in text and "×" not in text
    assert page.result_b is None and not w.state.job_busy("analysis-compare") and errors == []
    page.b_input.setText("Attention lets every word look at every other word in one step.")
    page.compare()
    qtbot.waitUntil(lambda: page.delta is not None, timeout=30000)
    assert page.stack.currentWidget() is page.canvas


def test_compare_shows_a_b_and_the_difference_at_1024_by_700(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="compare")
    w.resize(1024, 700)
    page = w.pages["compare"]
    qtbot.waitUntil(lambda: page.delta is not None, timeout=30000)
    qtbot.waitUntil(lambda: page.narrow is not None)
    shown = page.canvas.mapToScene(page.canvas.viewport().rect()).boundingRect()
    for panel in (page.a, page.b, page.diff):
        box = panel.plot.sceneBoundingRect()
        assert panel.plot.isVisible() and box.width() > 80 and box.height() > 80, box
        assert shown.contains(box), (box, shown)


def test_lines_page_draws_heads_and_focuses_a_hovered_token(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="lines")
    page = w.pages["lines"]
    qtbot.waitUntil(lambda: len(page.view.links) > 0, timeout=30000)
    assert page.heads() == [w.state.head]
    page.set_heads([0, 2])
    assert set(page.view.links[:, 0].astype(int)) == {0, 2}
    att = w.state.result.attentions[w.state.layer]
    kept = sum(min(12, int((row >= 0.02).sum())) for h in (0, 2) for row in att[h])  # 12 strongest keys per row
    assert len(page.view.links) == len(page.view.shown) == kept
    h, i, j, weight = page.view.links[-1]
    assert weight == att[int(h), int(i), int(j)]
    it = w.state.result.tokens.index("it")
    qtbot.waitUntil(lambda: not w.state.busy, timeout=20000)  # no late result redraws the page under the mouse
    pos = QPointF(page.view.mapFromScene(page.view.token_pos("query", it)))
    # the view's own hover handler, given the event Qt would send (a real cursor move is not delivered
    # reliably offscreen when the pointer already sits there)
    page.view.mouseMoveEvent(QMouseEvent(QEvent.MouseMove, pos, page.view.viewport().mapToGlobal(pos),
                                         Qt.NoButton, Qt.NoButton, Qt.NoModifier))
    assert "\"it\" looks at" in page.readout.text()
    shown = page.view.shown
    assert len(shown) and np.all(shown[:, 1] == it)
    assert len(shown) == sum(min(12, int((att[h, it] >= 0.02).sum())) for h in (0, 2))


def test_every_analysis_page_draws_an_image_model(make_window, qtbot):
    w = make_window(model="textbook-vit", image=sample("coffee"))
    for name in ("overview", "rollout", "norms", "search", "lines"):
        w.show_page(name)
    qtbot.waitUntil(lambda: w.pages["overview"].stats is not None and w.pages["norms"].data is not None
                    and bool(w.pages["search"].ranked), timeout=60000)
    assert w.pages["overview"].stats.distance_unit == "px"
    assert w.pages["search"].pattern.currentData() == "cls"
    assert "Showing the first 96" in w.pages["lines"].caption.text() or w.state.result.num_tokens <= 96


LONG = " ".join(["The animal didn't cross the street because it was too tired."] * 40)  # past 512 tokens


def _dark_share(panel) -> float:
    """The share of a panel's cells drawn in the bottom tenth of its colour scale."""
    lo, hi = panel.bar.levels()
    return float((panel.image.image < lo + 0.1 * (hi - lo)).mean())


def test_rollout_and_norms_are_readable_at_512_tokens(make_window, qtbot):
    w = make_window(model="minilm", text=LONG, view="rollout")
    assert w.state.result.num_tokens == 512
    page = w.pages["rollout"]
    qtbot.waitUntil(lambda: page.shown is not None and page.stack.currentWidget() is page.canvas, timeout=60000)
    assert _dark_share(page.panel) < 0.5, _dark_share(page.panel)  # with levels (0, max) nearly all of it was dark
    assert "99th" in page.panel.bar.axis.labelText and "99th percentile" in page.caption.text()
    w.show_page("norms")
    norms = w.pages["norms"]
    qtbot.waitUntil(lambda: norms.shown is not None, timeout=60000)
    for panel in (norms.raw, norms.norm):
        assert _dark_share(panel) < 0.5, _dark_share(panel)
        assert "99th" in panel.bar.axis.labelText


def test_rollout_norms_and_lines_use_log_scale_and_hide_specials(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="rollout")
    st, r = w.state, w.state.result
    page, norms, lines = w.pages["rollout"], w.pages["norms"], w.pages["lines"]
    qtbot.waitUntil(lambda: page.shown is not None, timeout=30000)
    st.set_options(log_scale=True, hide_special=True)
    qtbot.waitUntil(lambda: not st.busy, timeout=30000)
    qtbot.waitUntil(lambda: page.panel.matrix is not None and page.panel.matrix.shape == (14, 14), timeout=30000)
    assert page.tokens == r.tokens[1:-1] and "log" in page.panel.bar.axis.labelText
    assert page.panel.image.image.max() <= 0  # log10 of weights
    np.testing.assert_allclose(page.panel.matrix.sum(-1), 1.0, atol=1e-5)  # rows renormalised over what is drawn
    assert "14 of 16 tokens" in page.caption.text()
    w.show_page("norms")
    qtbot.waitUntil(lambda: norms.shown is not None, timeout=30000)
    a, nrm, fx, tok = norms.shown
    assert tok == r.tokens[1:-1] and a.shape == (14, 14) and "log" in norms.raw.bar.axis.labelText
    np.testing.assert_allclose(nrm, a * fx[None, :], rtol=1e-5)
    w.show_page("lines")
    qtbot.waitUntil(lambda: lines.tokens == r.tokens[1:-1], timeout=30000)
    assert not lines.note.isHidden() and "Log scale: not used here" in lines.note.text()
    assert "Hide specials" not in lines.note.text()  # it does use that one
    st.set_options(log_scale=False)
    assert lines.note.isHidden()


def test_overview_head_numbers_do_not_overlap_at_1024_by_700(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="overview")
    w.resize(1024, 700)
    page = w.pages["overview"]
    qtbot.waitUntil(lambda: page.stats is not None and page.stack.currentWidget() is page.canvas, timeout=30000)
    qtbot.wait(50)  # one layout pass after the resize
    shown = page.canvas.mapToScene(page.canvas.viewport().rect()).boundingRect()
    for name, p in page.plots.items():
        assert shown.contains(p.sceneBoundingRect()), (name, p.sceneBoundingRect(), shown)  # colour bar included
        axis = p.getAxis("bottom")
        drawn = axis.drawn_labels()
        fm = QFontMetrics(axis._font())
        assert len(drawn) >= 2, name
        for (x0, t0), (x1, t1) in zip(drawn, drawn[1:]):
            assert x1 - x0 >= (fm.horizontalAdvance(t0) + fm.horizontalAdvance(t1)) / 2 + 2, (name, t0, t1, x1 - x0)


def test_head_search_list_is_not_clipped_at_1024_by_700(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="search")
    w.resize(1024, 700)
    page = w.pages["search"]
    page.set_pattern("previous")
    qtbot.waitUntil(lambda: bool(page.ranked), timeout=30000)
    qtbot.wait(50)
    lst = page.ranking
    right = lst.mapTo(w, lst.rect().topRight()).x()
    assert right <= w.width(), (right, w.width())
    room = lst.viewport().width()
    fm = lst.fontMetrics()
    for i in range(lst.count()):
        assert fm.horizontalAdvance(lst.item(i).text()) < room, (lst.item(i).text(), room)


def test_value_norms_maps_and_bars_fit_1024_by_700(make_window, qtbot):
    w = make_window(model="minilm", text=TEXT, view="norms")
    w.resize(1024, 700)
    page = w.pages["norms"]
    qtbot.waitUntil(lambda: page.shown is not None, timeout=30000)
    qtbot.wait(50)
    shown = page.canvas.mapToScene(page.canvas.viewport().rect()).boundingRect()
    for p in (page.raw.plot, page.norm.plot, page.bars_plot):
        assert shown.contains(p.sceneBoundingRect()), (p.sceneBoundingRect(), shown)


def test_clearing_the_text_tells_every_analysis_page_there_is_nothing_to_measure(make_window, qtbot):
    """Seen in a real window: after the text was cleared, a not-yet-shown Head overview still said
    'Loading minilm…' although the model was loaded."""
    w = make_window(model="minilm", text=TEXT, view="grid")
    w.state.set_text("")
    qtbot.waitUntil(lambda: w.state.result is None)
    for name in ("overview", "rollout", "norms", "search", "compare"):
        w.show_page(name)
        page = w.pages[name]
        assert page.stack.currentWidget() is page.stack.placeholder, name
        assert page.stack.placeholder.text() == "minilm is loaded: type or paste some text to see its attention.", name
        assert page.caption.text() == "", name
