"""The Lab page's retrieval view at the smallest supported window (1024×700): the whole page, the check's bar
chart included, fits the tab without scrolling, the chart is tall enough to read, and the accuracy grid's
figures never run into each other (a crowded grid leaves them out: the hover says them)."""
from __future__ import annotations

import numpy as np
import pytest
import pyqtgraph as pg
from PySide6.QtCore import QPoint

from tests.analysis.atlas_planted import make_planted_folder
from tests.gui.analysis.lab_helpers import lab, retrieval


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return str(make_planted_folder(tmp_path_factory.mktemp("planted")))


def _bottom_in(widget, viewport) -> int:
    return widget.mapTo(viewport, QPoint(0, widget.height())).y()


def test_at_1024x700_the_check_chart_is_whole_and_reachable(make_window, qtbot, planted):
    w, page, banners = lab(make_window, planted)
    w.resize(1024, 700)
    retrieval(qtbot, page)
    w.show_page("lab")
    qtbot.wait(200)
    holder = w._tab_of["lab"]  # the scroll area the page sits in
    viewport = holder.viewport()
    # the page fits: nothing (the chart's axis, the read-out) is hidden below the tab's bottom edge
    assert _bottom_in(page.readout, viewport) <= viewport.height()
    assert _bottom_in(page.canvas, viewport) <= viewport.height()
    assert holder.verticalScrollBar().maximum() == 0
    # the chart lies inside the canvas, whole, and tall enough to read
    bar = page.view.bar_plot
    rect = bar.mapRectToScene(bar.boundingRect())
    assert rect.top() >= 0 and rect.bottom() <= page.canvas.viewport().height() + 1
    assert rect.height() >= 150
    grid = page.view.accuracy_plot
    g = grid.mapRectToScene(grid.boundingRect())
    assert g.bottom() <= rect.top() + 1 and g.height() >= 150
    assert not banners


def _crowded(page):
    from attn_explorer.analysis.lab import AblationCheck
    from attn_explorer.analysis.lab_retrieval import RetrievalResult
    from attn_explorer.session.lab import RetrievalRun

    rng = np.random.default_rng(0)
    lengths, depths = [1024, 2048, 4096, 8192, 16384, 32768], [0.0, 0.25, 0.5, 0.75, 1.0]
    actual = np.array([[n - 3 - j for j in range(5)] for n in lengths])
    r = RetrievalResult(page.state.info.name, lengths, depths, rng.random((6, 5)), rng.random((2, 2)), 40, [],
                        actual)
    check = AblationCheck(r.model, "needle accuracy", 0.8, [(1, 0)], 0.2, [[(0, 0)]] * 5,
                          [0.7, 0.75, 0.8, 0.78, 0.72], higher_is_worse=False)
    page.retrieval, page.retrieval_check = RetrievalRun(r, [], 8), check
    page.set_mode("retrieval")
    page.redraw()
    return r


@pytest.mark.parametrize("size", [(1024, 700), (1920, 1080)])
def test_the_accuracy_grid_figures_never_overlap(make_window, qtbot, planted, size):
    w, page, banners = lab(make_window, planted)
    w.resize(*size)
    r = _crowded(page)
    qtbot.wait(200)
    shown = [t for t in page.view.cell_texts if t.isVisible()]
    rects = [t.mapRectToScene(t.boundingRect()) for t in shown]
    for i, a in enumerate(rects):
        assert not any(a.intersects(b) for b in rects[i + 1:])
    if size == (1920, 1080):
        assert len(shown) == r.accuracy.size  # room for all of them
    left = page.view.accuracy_plot.getAxis("left")
    assert [t for _, t in left.drawn_labels()]  # the lengths are named, short ("32k")
    assert all(len(t) <= 4 for _, t in left.drawn_labels())
    # the bar chart's axis is in accuracy's own units, not scaled by an SI prefix (×0.001)
    assert page.view.bar_plot.getAxis("left").autoSIPrefixScale == 1.0
    assert "x0.001" not in page.view.bar_plot.getAxis("left").labelString()


def test_hovering_a_grid_cell_says_the_asked_and_the_actual_length(make_window, qtbot, planted):
    w, page, banners = lab(make_window, planted)
    r = _crowded(page)
    qtbot.wait(100)
    plot = page.view.accuracy_plot
    pos = plot.vb.mapViewToScene(pg.Point(2.5, 5.5))  # depth 0.5 (column 2), length 32,768 (row 5)
    page._hovered(pos)
    text = page.readout.text()
    assert "32,768" in text and "32,763" in text and "depth 0.5" in text and f"{r.accuracy[5, 2]:.0%}" in text
    assert page.canvas.toolTip() == text
