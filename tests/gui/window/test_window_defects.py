"""Defects a new user met in a real window: each test failed on the code before its fix."""
from __future__ import annotations


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
