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
    assert panel.no_fit.isVisible() and "no fit" in panel.no_fit.toPlainText()


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
        assert "no fit" in panel.no_fit.toPlainText()
    st.sweep_points = list(zip(ns, ms[:-1] + [ms[0]]))  # the longest n came out fast: really noisy
    panel.redraw_plot()
    assert "longest n was not the slowest" in panel.sweep_readout.text()
