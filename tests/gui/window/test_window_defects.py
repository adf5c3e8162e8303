"""Defects a new user met in a real window: each test failed on the code before its fix."""
from __future__ import annotations

import pytest


def test_rechoosing_the_current_model_keeps_the_sweep_and_the_status_bar(make_window, qtbot):
    w = make_window(model="textbook", text="the cat sat on the mat")
    st = w.state
    qtbot.waitUntil(lambda: not st.busy and w.status_labels["forward"].text() != "", timeout=20000)
    st.sweep_points = [(8, 1.0), (16, 2.5), (32, 6.0)]
    w.seq_panel.redraw_plot()
    labels = {k: w.status_labels[k].text() for k in ("tokens", "reuse", "forward")}
    result = st.result
    w.model_combo.activated.emit(w.model_combo.findData("textbook"))
    qtbot.wait(300)
    qtbot.waitUntil(lambda: not st.busy, timeout=20000)
    assert st.result is result and st.sweep_points == [(8, 1.0), (16, 2.5), (32, 6.0)]
    assert {k: w.status_labels[k].text() for k in labels} == labels
    assert len(w.seq_panel.sweep_scatter.getData()[0]) == 3
    assert w.model_combo.currentData() == "textbook"


def test_at_start_up_the_pages_do_not_ask_for_text_the_box_already_holds(make_window, qtbot):
    """Seen for about a second at start-up: "textbook is loaded: type or paste some text" over the pages while
    the box held the sample sentence and its first run was on its way."""
    w = make_window(model="textbook", wait=False)
    st = w.state
    assert st.has_input and w.input_panel.text.toPlainText() == st.text
    seen = {}

    def look(_info):
        seen["grid"] = w.grid.stack.placeholder.text()
        seen["head"] = w.head_view.stack.placeholder.text()
        seen["dk"] = w.dk_panel.readout.text()

    st.model_loaded.connect(look)
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=30000)
    assert seen, "the model loaded before the test could look"
    for where, text in seen.items():
        assert "type or paste" not in text and text.startswith("Running textbook"), (where, text)


def test_at_start_up_the_analysis_pages_say_the_first_run_is_on_its_way(make_window, qtbot):
    """The analysis pages (heatmap.follow_loading) said "textbook is loaded: type or paste some text" for about
    a second at start-up while the box held the sample sentence; they say what the explorer pages say."""
    w = make_window(model="textbook", wait=False)
    st = w.state
    assert st.has_input
    pages = [name for name in ("overview", "rollout", "norms") if name in w.pages]
    assert pages
    seen = {}
    st.model_loaded.connect(lambda _info: seen.update({n: w.pages[n].stack.placeholder.text() for n in pages}))
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=30000)
    assert seen, "the model loaded before the test could look"
    for where, text in seen.items():
        assert text == "Running textbook on the input…", (where, text)


def test_a_page_asks_for_text_when_the_model_loads_with_the_box_empty(make_window, qtbot):
    w = make_window(model="textbook", text="", wait=False)
    st = w.state
    seen = {}
    st.model_loaded.connect(lambda _info: seen.update(overview=w.pages["overview"].stack.placeholder.text(),
                                                      grid=w.grid.stack.placeholder.text()))
    qtbot.waitUntil(lambda: st.info is not None and not st.busy, timeout=30000)
    assert seen == {"overview": "textbook is loaded: type or paste some text to see its attention.",
                    "grid": "textbook is loaded: type or paste some text to see its attention."}


LONG_HOVER = ("queries 20,000–20,047 → keys 19,976–20,023: largest weight 0.123 (pooled: zoom in for each "
              "weight)")


def test_the_one_head_hover_line_never_widens_a_small_window(make_window, qtbot):
    """Seen at 1024×700: hovering the one-head map of a long input widened the window to 1082 px, cutting
    off the colour bar. The line is elided to the room there is; its whole text stays readable (tooltip)."""
    w = make_window(model="textbook")
    w.resize(1024, 700)
    w.show_page("head")
    qtbot.waitUntil(lambda: w.head_view.isVisible(), timeout=10000)
    qtbot.wait(100)
    assert w.width() <= 1024
    readout = w.head_view.readout
    readout.setText(LONG_HOVER)
    assert readout.text() == LONG_HOVER and readout.toolTip() == LONG_HOVER
    qtbot.wait(200)
    assert w.width() <= 1024
    assert readout.geometry().right() <= w.head_view.width()


def test_an_edit_keeps_the_one_head_zoom_and_its_go_to_label(make_window, qtbot):
    """Seen on a 28k-token input: Go to token 20000, zoom in, type " hello" at the end: the map jumped back to
    the whole input and the go-to label went while the box still said 20000. An edit keeps the window
    (clamped to the new length), and the box and its label keep agreeing."""
    text = " ".join(["the cat sat on the mat and looked at the dog"] * 20)
    w = make_window(model="textbook", text=text)
    st, view = w.state, w.head_view
    w.show_page("head")
    qtbot.waitUntil(lambda: view.isVisible() and len(view.tokens) == st.result.num_tokens, timeout=20000)
    R = len(view.tokens)
    assert R > 150
    view.goto.setText("150")
    assert view.go_to("150") == 150
    (_, _), (y0, y1) = view.plot.vb.viewRange()
    assert y1 - y0 < R / 2 and y0 <= 150 <= y1
    st.set_text(text + " hello")
    qtbot.waitUntil(lambda: not st.busy and len(view.tokens) == st.result.num_tokens > R, timeout=20000)
    qtbot.wait(100)
    (_, _), (z0, z1) = view.plot.vb.viewRange()
    assert (z0, z1) == pytest.approx((y0, y1), abs=0.5), "the zoom window was lost"
    assert view.goto.text() == "150" and "token 150" in view.goto_note.text()


def test_a_forward_timed_beside_a_side_job_says_so_and_is_not_plotted(make_window, qtbot):
    """Seen in a real window: with the Cost page measuring, a 6-token forward read "forward 290.5 ms" in the
    status bar as if that were the model's own time. A forward that ran beside a side job says so (which job,
    in the tooltip), and its time stays off the Sequence page's points; the next forward alone says nothing."""
    import threading

    w = make_window(model="textbook", text="the cat sat on the mat")
    st = w.state
    label = w.status_labels["forward"]
    qtbot.waitUntil(lambda: not st.busy and label.text() != "", timeout=20000)
    gate = threading.Event()
    assert st.submit(lambda: gate.wait(30), key="test-side-job", uses_model=False)
    try:
        before, old = list(st.timings), st.result
        w.input_panel.text.setPlainText("the dog sat on the log by the door")
        qtbot.waitUntil(lambda: st.result is not old and not st.busy, timeout=20000)
        assert "beside other jobs" in label.text() and "test-side-job" in label.toolTip()
        assert "beside other jobs, not plotted" in w.seq_panel.readout.text()
        assert st.timings == before
    finally:
        gate.set()
    qtbot.waitUntil(lambda: not st.job_busy("test-side-job"), timeout=20000)
    old = st.result
    w.input_panel.text.setPlainText("the cat sat on the mat by the door again")
    qtbot.waitUntil(lambda: st.result is not old and not st.busy, timeout=20000)
    assert label.text().startswith("forward ") and "beside" not in label.text() and label.toolTip() == ""
    assert "beside" not in w.seq_panel.readout.text()
    assert len(st.timings) == len(before) + 1
