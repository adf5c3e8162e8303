"""The Cost page's two log-log plots (time and peak memory against n) and their legends.

On log-log axes a cost that grows as n^p is a straight line of slope p. Each time point is the
median of its timed runs, with a bar from the fastest to the slowest run: when the bars of two
variants overlap, their order at that n is not settled. The legend sits under the plots as a small
table (it never covers a point and never wraps): each variant's fitted slopes, the n each fit starts
from, and its relative error. Everything here is drawn from plain dicts; nothing is computed but
log10 for pyqtgraph.
"""
from __future__ import annotations

import html
import math
import re

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QWidget

N_MIN = 64
_EMPTY = np.zeros(0)
MIN_SPAN = 0.6  # decades: the smallest axis range, so one n (or one time) is not drawn in a sliver
PAD = 0.15  # decades either side of what is drawn (the end ticks keep their labels)
BEAM = 0.012  # a min–max bar's cap, as a share of the n axis's range


def short_n(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def n_ticks(lo: int, hi: int) -> list[list[tuple[float, str]]]:
    """Ticks for a log n axis: every power of two from lo to hi (the axis is in log10 units)."""
    ticks, n = [], 1
    while n <= hi:
        if n >= lo:
            ticks.append((math.log10(n), short_n(n)))
        n *= 2
    return [ticks, []]


def value_ticks(lo: float, hi: float) -> list[list[tuple[float, str]]]:
    """Ticks for a log value axis: decades labelled, and 2 and 5 between them when the span is short."""
    lo_e, hi_e = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    major = [(float(e), f"{10.0 ** e:g}") for e in range(lo_e, hi_e + 1)]
    minor = [(math.log10(m * 10.0 ** e), f"{m * 10.0 ** e:g}" if hi_e - lo_e <= 3 else "")
             for e in range(lo_e, hi_e + 1) for m in (2, 5)]
    return [major, minor]


def _plot(title: str, unit: str) -> pg.PlotWidget:
    plot = pg.PlotWidget()
    plot.setLogMode(x=True, y=True)
    plot.showGrid(x=True, y=True, alpha=0.25)
    plot.setTitle(title)
    plot.setLabel("bottom", "sequence length n")
    plot.setLabel("left", unit)
    plot.setMenuEnabled(False)
    plot.setMinimumSize(200, 100)
    for side in ("left", "bottom"):
        plot.getAxis(side).enableAutoSIPrefix(False)  # the ticks are our own labels: no "(x0.001)" on them
    return plot


def log_range(values: list[float]) -> tuple[float, float]:
    """A log10 axis range around positive values: padded, and at least MIN_SPAN decades wide."""
    logs = [math.log10(v) for v in values if v and v > 0] or [0.0]
    lo, hi = min(logs), max(logs)
    if hi - lo < MIN_SPAN:
        mid = (lo + hi) / 2
        lo, hi = mid - MIN_SPAN / 2, mid + MIN_SPAN / 2
    return lo - PAD, hi + PAD


class CostPlots(QWidget):
    """Time and memory plots side by side, one legend under both, the fit rule and the noise verdict."""

    def __init__(self, variants: dict[str, dict], fit_rule: str, growth: float, parent: QWidget | None = None):
        super().__init__(parent)
        self.variants = variants
        self.time_plot = _plot("time per call", "ms")
        self.memory_plot = _plot("peak memory per call", "MB")
        self.curves: dict[str, tuple[pg.PlotDataItem, pg.PlotDataItem]] = {}
        self.error_bars: dict[str, pg.ErrorBarItem] = {}
        for name, v in variants.items():
            kw = dict(pen=pg.mkPen(v["colour"], width=2), symbol="o", symbolSize=7, symbolBrush=v["colour"],
                      symbolPen=None)
            self.curves[name] = (self.time_plot.plot([], [], **kw), self.memory_plot.plot([], [], **kw))
            bars = pg.ErrorBarItem(x=_EMPTY, y=_EMPTY, top=_EMPTY, bottom=_EMPTY, pen=pg.mkPen(v["colour"], width=1.5), beam=BEAM)
            self.time_plot.addItem(bars)
            self.error_bars[name] = bars
        self.not_run = self.memory_plot.plot([], [], pen=None, symbol="x", symbolSize=11,
                                             symbolPen=pg.mkPen("#333", width=2))
        self.n_markers = []
        for plot in (self.time_plot, self.memory_plot):
            line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#888", width=1, style=Qt.DashLine))
            plot.addItem(line, ignoreBounds=True)
            self.n_markers.append(line)
        # the legend: one row per variant with its slopes, under both plots (it never covers a point)
        self.legend = QWidget()
        legend = QGridLayout(self.legend)
        legend.setContentsMargins(4, 0, 4, 0)
        legend.setHorizontalSpacing(14)
        legend.setVerticalSpacing(0)
        for col, (text, tip) in enumerate((("", ""), ("time p", "slope of time against n on log-log axes"),
                                           ("memory p", "slope of peak memory against n on log-log axes"),
                                           ("relative error vs exact", "‖out − exact‖ / ‖exact‖ at the largest n "
                                            "measured, on random q, k, v")), start=0):
            head = QLabel(f"<small><i>{text}</i></small>")
            head.setToolTip(tip)
            legend.addWidget(head, 0, col)
        self.legend_cells: dict[str, list[QLabel]] = {}
        for row, (name, v) in enumerate(variants.items(), start=1):
            cells = [QLabel(f"<span style='color:{v['colour']}'>●</span> <b>{name}</b>"), QLabel(), QLabel(), QLabel()]
            for col, cell in enumerate(cells):
                cell.setTextFormat(Qt.RichText)
                legend.addWidget(cell, row, col)
            self.legend_cells[name] = cells
        legend.setColumnStretch(3, 1)
        self.fit_note = QLabel("<small>Dots: the median run; bars: fastest to slowest. "
                               f"p: log-log slope, fitted over large n only (cost ≥ {growth:g}× its smallest).</small>")
        self.fit_note.setToolTip(fit_rule[0].upper() + fit_rule[1:] + ".")
        self.fit_note.setWordWrap(True)
        self.noise_label = QLabel("")
        self.noise_label.setStyleSheet("QLabel { color: #8a1c1c; }")
        self.noise_label.hide()
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setVerticalSpacing(2)
        grid.addWidget(self.time_plot, 0, 0)
        grid.addWidget(self.memory_plot, 0, 1)
        grid.addWidget(self.legend, 1, 0, 1, 2)
        grid.addWidget(self.fit_note, 2, 0, 1, 2)
        grid.addWidget(self.noise_label, 3, 0, 1, 2)
        grid.setRowStretch(0, 1)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        # a wrapped label's height depends on its width, which a grid's minimum ignores: claim it, or the
        # plots above would be drawn over it at narrow widths
        self.fit_note.setMinimumHeight(self.fit_note.heightForWidth(max(1, event.size().width())))
        super().resizeEvent(event)

    def legend_row(self, name: str) -> list[str]:
        """A variant's legend row as plain text: [name, time p, memory p, error] (tests, screen readers)."""
        return [html.unescape(re.sub(r"<[^>]+>", "", c.text())).replace("\xa0", " ").strip()
                for c in self.legend_cells[name]]

    def draw(self, points: list[dict], fits: dict[str, dict], noise: str, current_n: int) -> None:
        """Draw every measured point, the fits in the legends, and the noise verdict."""
        for name, (t_curve, m_curve) in self.curves.items():
            pts = sorted((p for p in points if p["impl"] == name and p["status"] == "ok"), key=lambda p: p["n"])
            t_curve.setData([p["n"] for p in pts], [p["ms"] for p in pts])
            self._set_bars(name, pts)
            mem = [(p["n"], p["peak_bytes"] / 1e6) for p in pts if p.get("peak_bytes")]
            m_curve.setData([a for a, _ in mem], [b for _, b in mem])
            f = fits.get(name, {})
            errs = [p for p in pts if p.get("rel_error") is not None]
            cells = self.legend_cells[name]
            cells[1].setText(self._slope(f.get("time"), f.get("time_from"), len({p["n"] for p in pts})))
            cells[2].setText(self._slope(f.get("memory"), f.get("memory_from"), len({n for n, _ in mem})) if mem else "–")
            cells[3].setText(f"{errs[-1]['rel_error']:.2g} at n = {errs[-1]['n']:,}" if errs else
                             "exact (reference)" if pts and self.variants[name]["exact"] and name in ("naive", "sdpa")
                             else "–")
            for cell in cells:
                cell.setVisible(bool(pts))
        missed = [p for p in points if p["status"] != "ok" and p.get("predicted_bytes")]
        self.not_run.setData([p["n"] for p in missed], [p["predicted_bytes"] / 1e6 for p in missed])
        self.legend.setVisible(any(p["status"] == "ok" for p in points))
        self.noise_label.setText("⚠ These timings are noisy: slopes and speed ratios are not reliable (hover for why)."
                                 if noise else "")
        self.noise_label.setToolTip(noise)
        self.noise_label.setVisible(bool(noise))
        self.set_n(current_n, points)
        ok = [p for p in points if p["status"] == "ok"]
        # explicit ranges, never autorange: one n alone would get a sliver of an axis, and the bars' caps
        # (sized against the n range) would then run across the whole plot
        ns = [p["n"] for p in points] + [current_n] + ([] if points else [N_MIN])
        x_range = log_range(ns)
        for bars in self.error_bars.values():
            bars.setData(beam=BEAM * (x_range[1] - x_range[0]))
        for plot, ys in ((self.time_plot, [p.get("ms_min") or p["ms"] for p in ok] + [p.get("ms_max") or p["ms"] for p in ok]),
                         (self.memory_plot, [p["peak_bytes"] / 1e6 for p in ok if p.get("peak_bytes")]
                          + [p["predicted_bytes"] / 1e6 for p in missed])):
            ys = [y for y in ys if y and y > 0] or [0.1, 1000.0]  # nothing yet: 0.1 to 1000 (ms or MB)
            plot.setXRange(*x_range, padding=0)
            plot.setYRange(*log_range(ys), padding=0)
            plot.getAxis("left").setTicks(value_ticks(min(ys), max(ys)))

    @staticmethod
    def _slope(p: float | None, start: int | None, sizes: int = 2) -> str:
        """The legend's slope cell (rich text): p and where its fit starts, or why there is no p."""
        if p is None:
            return "– (one n)" if sizes < 2 else "– (grew &lt; 4×)"
        return f"{p:.2f} (n ≥ {short_n(start)})" if start else f"{p:.2f}"

    def _set_bars(self, name: str, pts: list[dict]) -> None:
        """Min–max bars in the plot's log10 coordinates (pyqtgraph's log mode maps only data items)."""
        spread = [p for p in pts if p.get("ms_min") and p.get("ms_max")]
        bars = self.error_bars[name]
        if not spread:
            bars.setData(x=_EMPTY, y=_EMPTY, top=_EMPTY, bottom=_EMPTY)
            bars.hide()
            return
        x = np.log10([p["n"] for p in spread])
        y = np.log10([p["ms"] for p in spread])
        bars.setData(x=x, y=y, top=np.log10([p["ms_max"] for p in spread]) - y,
                     bottom=y - np.log10([p["ms_min"] for p in spread]))
        bars.show()

    def set_n(self, n: int, points: list[dict]) -> None:
        """Move the n markers and fit the n ticks to the measured sizes and the slider's n."""
        for line in self.n_markers:
            line.setPos(math.log10(n))  # the plots are log-log: items sit at log10 coordinates
        ns = [p["n"] for p in points] + [n] + ([] if points else [N_MIN])
        for plot in (self.time_plot, self.memory_plot):
            plot.getAxis("bottom").setTicks(n_ticks(min(ns), max(ns)))
