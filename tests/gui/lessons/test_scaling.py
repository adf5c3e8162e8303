"""Lesson page "scaling": curves and table show the pure numbers and follow the knobs."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.lessons import scaling

LESSON, SIZE = "scaling", (1000, 800)


def _curve_y(plot, index: int) -> np.ndarray:
    item = plot.getPlotItem().listDataItems()[index]
    y = item.getData()[1]
    return 10 ** y if plot.getPlotItem().ctrl.logYCheck.isChecked() else y  # log mode stores log10 values


def test_plots_and_table_equal_the_pure_curves(page):
    want = scaling.scaling_curves(num_keys=16, seed=0)
    np.testing.assert_allclose(_curve_y(page.spread_plot, 0), want.spread.scaled, rtol=1e-6)
    np.testing.assert_allclose(_curve_y(page.spread_plot, 1), want.spread.unscaled, rtol=1e-6)
    np.testing.assert_allclose(_curve_y(page.entropy_plot, 1), want.entropy.unscaled, rtol=1e-6)
    np.testing.assert_allclose(_curve_y(page.grad_plot, 1), want.gradient.unscaled, rtol=1e-6)
    rows = page.cell_texts()
    assert [r[0] for r in rows] == [str(d) for d in scaling.DIMS]
    assert rows[-1][2] == f"{want.spread.unscaled[-1]:.2f}"
    assert rows[-1][4] == f"{want.entropy.unscaled[-1]:.2f}"
    assert rows[-1][6] == f"{want.gradient.unscaled[-1]:.1e}"
    assert f"{want.entropy.unscaled[-1]:.2f} bits" in page.summary.text()


def test_changing_keys_and_seed_recomputes_everything(page, settle):
    page.keys.setValue(64)
    settle(page)
    want = scaling.scaling_curves(num_keys=64, seed=0)
    assert page.curves.num_keys == 64
    np.testing.assert_allclose(_curve_y(page.entropy_plot, 0), want.entropy.scaled, rtol=1e-6)
    assert page.cell_texts()[0][3] == f"{want.entropy.scaled[0]:.2f}"
    assert "log₂ 64" in " ".join(i.label.toPlainText() for i in page.entropy_plot.getPlotItem().items
                                  if hasattr(i, "label") and hasattr(i.label, "toPlainText"))
    page.seed.setValue(7)
    settle(page)
    again = scaling.scaling_curves(num_keys=64, seed=7)
    np.testing.assert_allclose(_curve_y(page.spread_plot, 1), again.spread.unscaled, rtol=1e-6)
    assert "seed 7" in page.summary.text()


def _drawn_labels(axis):
    """(text, rect) of every tick label the axis draws now."""
    from PySide6.QtGui import QImage, QPainter

    img = QImage(8, 8, QImage.Format_ARGB32)
    painter = QPainter(img)
    try:
        specs = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(text, rect) for rect, _flags, text in specs[2]]


@pytest.mark.parametrize("width", [430, 1000])  # the page beside the side panels at 1024×700; and wide
def test_log_axis_labels_are_readable(page, qtbot, settle, width):
    """No two tick labels on any axis touch, and the d_k axis names the d_k values (4 … 1024), not 10¹."""
    page.resize(width, 700)
    qtbot.waitUntil(lambda: page.spread_plot.width() < width, timeout=5000)
    page.seed.setValue(1)  # drawn again at this size
    settle(page)
    plots = (page.spread_plot, page.entropy_plot, page.grad_plot)
    qtbot.waitUntil(lambda: all(len(_drawn_labels(p.getPlotItem().getAxis("bottom"))) >= 2 for p in plots), timeout=5000)
    for plot in plots:
        for side in ("bottom", "left"):
            labels = _drawn_labels(plot.getPlotItem().getAxis(side))
            assert len(labels) >= 2, (plot, side, labels)
            assert not any("·10" in t for t, _ in labels), labels
            rects = sorted((r for _, r in labels), key=(lambda r: r.left()) if side == "bottom" else (lambda r: r.top()))
            for a, b in zip(rects, rects[1:]):
                gap = b.left() - a.right() if side == "bottom" else b.top() - a.bottom()
                assert gap >= 2, (side, [t for t, _ in labels])
        ticks = [t for t, _ in _drawn_labels(plot.getPlotItem().getAxis("bottom"))]
        assert set(ticks) <= {str(d) for d in scaling.DIMS} and {"4", "1024"} <= set(ticks), (plot, ticks,
                                                                                              plot.getPlotItem().viewRange())
