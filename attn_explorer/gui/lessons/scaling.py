"""Lesson page "scaling": why attention divides its scores by √d_k.

Three plots over d_k = 4…1024 (log x axis), each with two curves, scaled (÷√d_k) and unscaled: the
spread of the scores, the softmax's entropy, and the size of its gradient. The numbers come from
`lessons.scaling` (core's scaled_dot_product_attention; autograd for the gradient), computed in a worker
(lane "lesson-scaling", newest wins); the page says "Computing…" meanwhile. A table below lists every number drawn.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QAbstractScrollArea, QBoxLayout, QHBoxLayout, QHeaderView, QSpinBox,
                               QTableWidget, QTableWidgetItem, QWidget)

from attn_explorer.gui.widgets.tables import explanation, message_label, scrolling_page
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

INTRO = (
    "<b>Why divide by √d_k?</b> A score is a dot product q·k: d_k products added up. If each number in q "
    "and k is random with spread 1, the sum has spread √d_k. So the longer the vectors, the further apart "
    "the scores. Softmax turns big gaps into near-certainty: one key gets almost all the weight. "
    "The softmax <i>saturates</i>, and its gradient vanishes, so learning stalls.<br>"
    "Dividing by √d_k brings the spread back to about 1 at every d_k. Here q and k are random (seeded); "
    "each query chooses among the keys. <span style='color:#1f77b4'><b>Blue</b></span>: scaled by 1/√d_k. "
    "<span style='color:#d62728'><b>Red</b></span>: not scaled."
)
SCALED, UNSCALED = "#1f77b4", "#d62728"
SIDE_BY_SIDE_PX = 900
DIMS_UNLABELLED = (8, 32, 128, 512)
LANE = "lesson-scaling"
COLUMNS = ["d_k", "spread ÷√d_k", "spread", "entropy ÷√d_k", "entropy", "gradient ÷√d_k", "gradient"]


D_K_LABELLED = (4, 16, 64, 256, 1024)  # every other d_k: the labels fit beside the side panels at 1024 px
MAX_Y_LABELS = 6


def number_label(v: float) -> str:
    """A tick label in plain numbers: 0.5, 2, 30, or 1e-6 far from 1 (never 10¹ or 3·10¹)."""
    if 1e-3 <= v < 1e4:
        return f"{v:g}"
    exp = int(np.floor(np.log10(v)))
    mant = round(v / 10 ** exp)
    return f"1e{exp}" if mant == 1 else f"{mant}e{exp}"


def log_ticks(lo: float, hi: float, most: int = MAX_Y_LABELS) -> list[list[tuple[float, str]]]:
    """pyqtgraph ticks (log10 positions) for a log axis over [lo, hi]: labelled 1-2-5 steps, or whole
    decades, or every k-th decade, whichever gives at most `most` labels; the rest unlabelled."""
    lo, hi = max(lo, 1e-300), max(hi, lo * 10)
    first, last = int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi)))
    for mantissas in ((1, 2, 5), (1,)):
        values = [m * 10.0 ** e for e in range(first, last + 1) for m in mantissas]
        values = [v for v in values if lo / 1.05 <= v <= hi * 1.05]
        if 2 <= len(values) <= most:
            break
    else:
        decades = [10.0 ** e for e in range(first, last + 1)]
        step = int(np.ceil(len(decades) / most))
        values = decades[::step]
    major = [(float(np.log10(v)), number_label(v)) for v in values]
    return [major, []]


def _plot(title: str, y_label: str, log_y: bool, legend_at: tuple[int, int]) -> pg.PlotWidget:
    """legend_at: pyqtgraph's legend offset (x > 0: from the left; y < 0: from the bottom), where the curves are not."""
    w = pg.PlotWidget(title=title)
    w.setMinimumSize(220, 240)
    w.setMaximumHeight(340)
    p = w.getPlotItem()
    p.getAxis("left").enableAutoSIPrefix(False)  # no "(x0.001)" beside log ticks
    p.addLegend(offset=legend_at, labelTextSize="8pt")
    p.setLogMode(x=True, y=log_y)
    p.setLabel("bottom", "d_k (log scale)")
    p.getAxis("bottom").setTicks([[(float(np.log10(d)), str(d)) for d in D_K_LABELLED],
                                  [(float(np.log10(d)), "") for d in DIMS_UNLABELLED]])
    p.setLabel("left", y_label)
    p.showGrid(x=True, y=True, alpha=0.25)
    p.setMouseEnabled(False, False)
    p.hideButtons()
    return w


class ScalingLesson(QWidget):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.lanes = (LANE,)
        self.curves = None  # the ScalingCurves on screen
        lay = scrolling_page(self)
        lay.addWidget(explanation(INTRO))
        knobs = QHBoxLayout()
        self.keys = QSpinBox()
        self.keys.setRange(2, 1024)
        self.keys.setValue(16)
        self.keys.setPrefix("keys: ")
        self.keys.setToolTip("How many keys each query chooses among (the most entropy is log₂ of it)")
        self.seed = QSpinBox()
        self.seed.setRange(0, 9999)
        self.seed.setPrefix("seed: ")
        self.seed.setToolTip("Another seed draws other random q and k")
        for w in (self.keys, self.seed):
            knobs.addWidget(w)
        knobs.addStretch(1)
        lay.addLayout(knobs)
        self.message = message_label()
        lay.addWidget(self.message)

        self.spread_plot = _plot("Spread (std) of the scores", "std", log_y=True, legend_at=(8, 8))
        self.entropy_plot = _plot("Softmax entropy", "bits", log_y=False, legend_at=(8, -8))
        self.grad_plot = _plot("Softmax gradient size", "|∂loss/∂score|", log_y=True, legend_at=(8, -8))
        self.plots = QBoxLayout(QBoxLayout.TopToBottom)
        for w in (self.spread_plot, self.entropy_plot, self.grad_plot):
            self.plots.addWidget(w)
        lay.addLayout(self.plots)
        self.summary = explanation("")
        lay.addWidget(self.summary)
        lay.addWidget(explanation(
            "<b>What the numbers are.</b> <i>Spread</i>: the standard deviation of the scores the softmax "
            "receives. <i>Entropy</i>: how spread out one query's weights are, in bits, averaged over queries "
            "(log₂ of the number of keys when all are equal, 0 when one key takes everything). "
            "<i>Gradient</i>: for a random loss on the weights, the length of its gradient with respect to "
            "the scores, for the typical (median) query, by torch autograd."))
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.NoSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.setSizeAdjustPolicy(QAbstractScrollArea.AdjustToContents)
        lay.addWidget(self.table, 0, Qt.AlignLeft)
        lay.addStretch(1)

        self.keys.valueChanged.connect(self.recompute)
        self.seed.valueChanged.connect(self.recompute)
        self.recompute()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        wide = event.size().width() >= SIDE_BY_SIDE_PX
        self.plots.setDirection(QBoxLayout.LeftToRight if wide else QBoxLayout.TopToBottom)

    def recompute(self) -> None:
        self.message.setText("Computing…")
        self.state.submit(L.scaling_curves, self.keys.value(), self.seed.value(), key=LANE, uses_model=False,
                          on_result=self._computed, on_error=self._refused)

    def _refused(self, message: str) -> None:
        self.curves = None
        self.message.setText(message)
        for w in (self.spread_plot, self.entropy_plot, self.grad_plot):
            w.getPlotItem().clear()
        self.table.setRowCount(0)
        self.summary.setText("")

    def _computed(self, c) -> None:
        self.curves = c
        self.message.setText("")
        self._draw(c)
        self._fill_table(c)
        last = -1
        self.summary.setText(
            f"At d_k = {c.dims[last]}: without scaling the scores spread {c.spread.unscaled[last]:.1f} "
            f"(√d_k = {np.sqrt(c.dims[last]):.0f}), the entropy falls to {c.entropy.unscaled[last]:.2f} bits of "
            f"at most {c.max_entropy:.2f}, and the gradient to {c.gradient.unscaled[last]:.1e}. "
            f"With ÷√d_k: spread {c.spread.scaled[last]:.2f}, entropy {c.entropy.scaled[last]:.2f} bits, "
            f"gradient {c.gradient.scaled[last]:.2f}. "
            f"({c.num_queries} random queries, {c.num_keys} keys, seed {c.seed}.)")

    def _draw(self, c) -> None:
        x = c.dims.astype(float)
        for w, curve in ((self.spread_plot, c.spread), (self.entropy_plot, c.entropy), (self.grad_plot, c.gradient)):
            p = w.getPlotItem()
            p.clear()
            p.legend.clear()
            log_y = p.ctrl.logYCheck.isChecked()
            floor = 1e-12 if log_y else -np.inf  # log axes cannot show 0
            for ys, colour, name in ((curve.scaled, SCALED, "÷√d_k"), (curve.unscaled, UNSCALED, "not scaled")):
                p.plot(x, np.maximum(ys, floor), pen=pg.mkPen(colour, width=2), symbol="o", symbolSize=6,
                       symbolBrush=colour, symbolPen=None, name=name)
            if log_y:  # readable labels, as many as fit, in plain numbers
                ys = np.maximum(np.concatenate([curve.scaled, curve.unscaled]), floor)
                p.getAxis("left").setTicks(log_ticks(float(ys.min()), float(ys.max())))
            if w is self.entropy_plot:
                top = pg.InfiniteLine(c.max_entropy, angle=0, pen=pg.mkPen("#777", style=Qt.DashLine),
                                      label=f"most: log₂ {c.num_keys} = {c.max_entropy:.2f}",
                                      labelOpts={"position": 0.25, "color": "#555"})
                p.addItem(top)
                p.setYRange(0, c.max_entropy * 1.08, padding=0)
            else:
                p.enableAutoRange(axis="y")
            # room for the first and last d_k labels (log10 positions: the axis is in log mode)
            p.setXRange(float(np.log10(x.min() / 1.6)), float(np.log10(x.max() * 2.0)), padding=0)

    def _fill_table(self, c) -> None:
        rows = [c.dims, c.spread.scaled, c.spread.unscaled, c.entropy.scaled, c.entropy.unscaled,
                c.gradient.scaled, c.gradient.unscaled]
        fmts = ["{:.0f}", "{:.2f}", "{:.2f}", "{:.2f}", "{:.2f}", "{:.3f}", "{:.1e}"]
        self.table.setRowCount(len(c.dims))
        for i in range(len(c.dims)):
            for j, (col, fmt) in enumerate(zip(rows, fmts)):
                item = QTableWidgetItem(fmt.format(float(col[i])))
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(i, j, item)
        h = self.table.horizontalHeader().height() + sum(self.table.rowHeight(i) for i in range(len(c.dims)))
        self.table.setFixedHeight(h + 2 * self.table.frameWidth() + 2)

    def cell_texts(self) -> list[list[str]]:
        """The table as drawn (tests)."""
        return [[self.table.item(i, j).text() for j in range(self.table.columnCount())]
                for i in range(self.table.rowCount())]
