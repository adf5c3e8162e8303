"""The sequence-length panel says what was run: the slider, its label and the k×k text agree with the
result, and the forward-ms plot draws a fit only when the data can carry one."""
from __future__ import annotations

import numpy as np
import pytest



def test_n_slider_minimum_runs_exactly_that_many_tokens(make_window, qtbot):
    w = make_window(model="minilm")
    st, panel = w.state, w.seq_panel
    qtbot.waitUntil(lambda: panel.slider.maximum() == st.result.num_tokens == 16)
    low = panel.slider.minimum()
    assert low == 3  # [CLS], one real token, [SEP]: the smallest n that still reads the text
    panel.slider.setValue(low)
    assert panel.value.text() == f"n = {low}"
    qtbot.waitUntil(lambda: not st.busy and st.result.num_tokens != 16, timeout=20000)
    # the panel has redrawn from this result and has no slider move left to send: a stray second run
    # (the old snap-back) would have been asked for by now
    qtbot.waitUntil(lambda: f"{low}×{low}" in panel.readout.text() and not panel.debounce.isActive()
                    and not st.busy, timeout=10000)
    r = st.result
    assert r.num_tokens == low and r.tokens[1] == "the"
    qtbot.waitUntil(lambda: f"{low}×{low}" in panel.readout.text())
    assert panel.slider.value() == low and panel.value.text() == f"n = {low}"


def test_few_ordinary_runs_draw_no_fit_and_say_why(make_window, qtbot):
    w = make_window(model="textbook")
    st, panel = w.state, w.seq_panel
    for n in (5, 8, 3):
        st.set_max_tokens(n)
        qtbot.waitUntil(lambda: st.result.num_tokens == n and not st.busy, timeout=20000)
    # every measured run is drawn: 3, or 4 when the window's first run was not the model's warm-up (a model
    # made warm by an earlier test), so the test does not depend on the order tests run in
    qtbot.waitUntil(lambda: len(panel.live_points.getData()[0]) == len(st.timings) >= 3)
    assert panel.fit is None
    xs, _ = panel.curve.getData()
    assert xs is None or len(xs) == 0
    assert panel.no_fit.isVisible() and "no fit" in panel.no_fit.text()


@pytest.mark.parametrize("concave", [False, True])
def test_noisy_note_is_true_to_the_data(make_window, qtbot, concave):
    w = make_window(model="textbook")
    st, panel = w.state, w.seq_panel
    ns = [8, 16, 32, 64, 128, 256, 512]
    # concave (a <= 0) but monotonic: the longest n WAS the slowest, so it is not "noisy"
    ms = [10 * np.sqrt(n) for n in ns] if concave else [1e-4 * n * n + 0.01 * n + 1 for n in ns]
    st.sweep_points = list(zip(ns, ms))
    panel.redraw_plot()
    text = panel.sweep_readout.text()
    assert "longest n was not the slowest" not in text
    assert (panel.fit is None) == concave
    if concave:
        assert "no fit" in panel.no_fit.text()
    st.sweep_points = list(zip(ns, ms[:-1] + [ms[0]]))  # the longest n came out fast: really noisy
    panel.redraw_plot()
    assert "longest n was not the slowest" in panel.sweep_readout.text()


def _global_rect_of_caption(panel):
    """Where the "no fit" caption is on screen, in global pixels (an item over the plot, or a label)."""
    from PySide6.QtCore import QRect
    from PySide6.QtWidgets import QWidget

    cap = panel.no_fit
    if isinstance(cap, QWidget):
        return QRect(cap.mapToGlobal(cap.rect().topLeft()), cap.size())
    view = panel.plot
    r = view.mapFromScene(cap.sceneBoundingRect()).boundingRect()
    return QRect(view.viewport().mapToGlobal(r.topLeft()), r.size())


def test_a_long_sweep_s_caption_covers_no_point_and_its_times_read_in_minutes(make_window, qtbot):
    """Seen in a real window: the "no fit yet…" caption covered the 251 s point, and the panel said
    "forward 250991.7 ms" where "4 min 11 s" reads at once."""
    import dataclasses

    from PySide6.QtCore import QPointF

    w = make_window(model="textbook")
    st, panel = w.state, w.seq_panel
    qtbot.waitUntil(lambda: not st.busy and panel.plot.isVisible(), timeout=20000)
    st.timings = [(4096, 251_000.0)]  # the user's own long run: the slowest point, in the middle of the range
    st.sweep_points = [(1024, 2_100.0), (2048, 9_000.0), (8192, 120_000.0)]  # three lengths: no fit
    panel.redraw_plot()
    qtbot.wait(50)
    assert panel.fit is None and panel.no_fit.isVisible() and "no fit" in panel.no_fit_reason
    caption = _global_rect_of_caption(panel)
    vb = panel.plot.getViewBox()
    for n, ms in st.sweep_points + st.timings:
        p = panel.plot.mapFromScene(vb.mapViewToScene(QPointF(n, ms)))
        assert not caption.contains(panel.plot.viewport().mapToGlobal(p)), (n, ms)
    slow = dataclasses.replace(st.result, forward_ms=250_991.7, warm_up=False)
    st.result = slow
    panel.refresh()
    w._result_arrived(slow)
    assert "forward <b>4 min 11 s</b>" in panel.readout.text()
    assert w.status_labels["forward"].text() == "forward 4 min 11 s"


def test_human_duration_reads_each_scale():
    from attn_explorer.gui.explorer.seq_panel import human_duration

    assert human_duration(12.34) == "12.3 ms"
    assert human_duration(1_234.0) == "1.2 s"
    assert human_duration(59_940.0) == "59.9 s"
    assert human_duration(250_991.7) == "4 min 11 s"
    assert human_duration(3 * 3_600_000 + 125_000) == "3 h 2 min"
