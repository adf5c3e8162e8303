"""Issue 24 D on the head page: while a new input's run is in flight, the one-head map on screen is the previous
input's, and its header says so (as the grid's does), with the run's line; Stop takes the mark away, and so do
the new maps. The long forward: test_long_run_window's 40-layer tiny Llama, every layer slowed."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from PySide6.QtCore import Qt  # noqa: E402

from tests.gui.window.test_long_run_window import _start_slow_edit, deep_folder, long_window  # noqa: E402,F401


def test_the_head_pages_map_is_marked_as_the_previous_inputs_while_a_run_is_in_flight(qtbot, long_window):  # noqa: F811
    window, state, slow = long_window
    from attn_explorer.gui.explorer.grid_view import PREVIOUS

    window.show_page("head")
    hv = window.head_view
    qtbot.waitUntil(lambda: hv.isVisible() and "Layer" in hv.title.text(), timeout=10000)
    assert PREVIOUS not in hv.title.text()
    before = _start_slow_edit(qtbot, window, state, slow)
    qtbot.waitUntil(lambda: PREVIOUS in hv.title.text(), timeout=3000)
    assert "layer" in hv.title.text() and state.result is before  # the run's line: layer k of L
    state.select(head=1)  # another head of the old maps: still marked
    qtbot.waitUntil(lambda: "head 1" in hv.title.text(), timeout=3000)
    assert PREVIOUS in hv.title.text()
    qtbot.keyClick(window, Qt.Key_Escape)  # Stop: the old maps stay, no longer "previous" to a run
    qtbot.waitUntil(lambda: not state.busy, timeout=5000)
    qtbot.waitUntil(lambda: PREVIOUS not in hv.title.text(), timeout=3000)
    assert "Layer" in hv.title.text()
    slow["s"] = 0.0
    state.set_text("The capital of Spain is Madrid.")
    qtbot.waitUntil(lambda: state.result is not before and not state.busy, timeout=30000)
    assert PREVIOUS not in hv.title.text()
