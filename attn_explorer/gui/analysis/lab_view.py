"""The Lab page's drawing: an L×H grid of head scores, the accuracy grid by (length, depth), the ablation
check's bars (clean, the top heads off, each random set off with their mean ± spread), and the words under
them. Drawing only: the numbers come from `session.lab`'s jobs.
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtGui import QFont, QFontMetricsF

from attn_explorer.gui.analysis.common import cell_plot, label_cells, peak
from attn_explorer.gui.widgets.heatmap import cell_centre, cell_under, colormap, lut_rgb, set_bar_label

TOP_LISTED = 10  # heads in the side list
GRID_MIN, BARS_MIN = 150, 150  # the least height (px) of the grids' row and of the check's chart
MIN_POINT = 6.5  # the accuracy cells' figures shrink to this font size, then go (the hover line says them)


def short_length(n: int) -> str:
    """A haystack length in at most 4 characters, for the accuracy grid's rows: 512, 1k (1,024), 1.5k, 32k
    (32,768), 100k; the exact figure is in the hover line."""
    n = int(n)
    if n < 1000:
        return str(n)
    if n % 1024 == 0:
        return f"{n // 1024}k"
    return f"{n / 1000:.2g}k" if n < 10000 else f"{n // 1000}k"


def cell_line(result, i: int, j: int) -> str:
    """One accuracy cell in words: the asked length, the tokens the prompt actually had, the depth, the accuracy."""
    n, d, v = result.lengths[i], result.depths[j], float(result.accuracy[i, j])
    actual = getattr(result, "actual", None)
    read = (f" (the prompts had {int(actual[i, j]):,} tokens: the filler is cut to fit)"
            if actual is not None and actual[i, j] >= 0 else "")
    acc = "no case" if not np.isfinite(v) else f"accuracy {v:.0%}"
    return f"length {n:,} asked{read}, depth {d:g}: {acc}"


def heads_text(heads) -> str:
    return ", ".join(f"L{l} H{h}" for l, h in heads)


def ranking_line(layer: int, head: int, score: float, what: str) -> str:
    return f"L{layer:<2} H{head:<2}  {what} {score:.3f}"


def verdict_html(check, what: str) -> str:
    """The check in words: the figures, then whether the top heads matter more than random ones."""
    k, n = len(check.top_heads), len(check.random)
    better = "higher" if check.higher_is_worse else "lower"
    fmt = (lambda v: f"{v:.3f}") if check.higher_is_worse else (lambda v: f"{v:.0%}")
    head = (f"<b>Switching off the top {k} {what} heads ({heads_text(check.top_heads)})</b> "
            f"{'matters more' if check.passed else '<u>does not</u> matter more'} than switching off {k} random "
            f"heads.")
    figures = (f"{html.escape(check.what)}: clean {fmt(check.clean)}; top {k} off {fmt(check.top)}; "
               f"{n} random sets of {k} off {fmt(check.random_mean)} ± {fmt(check.random_spread)} (mean ± sd). "
               f"Worse is {better}. Bars: clean, the top heads off, the random sets' mean ± sd; dots: each set.")
    return f"{head}<br>{figures}"


class LabCanvas:
    """What the page's canvas shows: built afresh for every result, so nothing of an old one stays."""

    def __init__(self, canvas: pg.GraphicsLayoutWidget, cmap: str):
        self.canvas = canvas
        self.cmap = cmap
        self.heads: np.ndarray | None = None  # the (L, H) scores drawn in the head grid
        self.head_plot: pg.PlotItem | None = None
        self.accuracy: np.ndarray | None = None  # the (lengths, depths) accuracy drawn
        self.accuracy_plot: pg.PlotItem | None = None
        self.bar_plot: pg.PlotItem | None = None
        self.result = None  # the RetrievalResult drawn (the hover line reads it)
        self.cell_texts: list[pg.TextItem] = []  # each accuracy cell's figure, shown where they all fit

    def clear(self) -> None:
        self.canvas.clear()
        self.heads, self.head_plot, self.accuracy, self.accuracy_plot, self.bar_plot = None, None, None, None, None
        self.result, self.cell_texts = None, []
        lay = self.canvas.ci.layout
        for i in range(2):  # the rows and columns the views use; no other is made
            lay.setColumnStretchFactor(i, 1)
            lay.setRowStretchFactor(i, 1)

    # ------------------------------------------------------------------------------------ pieces
    def _head_grid(self, scores: np.ndarray, row: int, col: int, title: str, label: str) -> None:
        L, H = scores.shape
        p = self.head_plot = cell_plot(self.canvas, row, col)
        p.setLabel("left", "layer")
        p.setLabel("bottom", "head")
        img = pg.ImageItem(axisOrder="row-major")
        p.addItem(img)
        shown = np.nan_to_num(scores.astype(np.float32), nan=0.0)
        top = peak(shown)
        img.setImage(shown, levels=(0.0, top), autoLevels=False)
        img.setRect(QRectF(0, 0, H, L))
        bar = pg.ColorBarItem(values=(0.0, top), colorMap=colormap(self.cmap), interactive=False, width=12)
        bar.axis.enableAutoSIPrefix(False)  # before its label: else the label's SI scale (×0.001) stays
        bar.setImageItem(img, insert_in=p)
        set_bar_label(bar, label)
        p.setRange(xRange=(0, H), yRange=(0, L), padding=0.02)
        label_cells(p, L, H)
        p.setTitle(title)
        p.setMinimumHeight(GRID_MIN)
        self.heads = scores

    def _bars(self, check, row: int, col: int, colspan: int = 1) -> None:
        p = self.bar_plot = self.canvas.addPlot(row=row, col=col, colspan=colspan)
        p.setMenuEnabled(False)
        p.hideButtons()
        p.setMouseEnabled(x=False, y=False)
        k, n = len(check.top_heads), len(check.random)
        heights = [check.clean, check.top, check.random_mean]
        colours = ["#8a8a8a", "#d62728", "#1f77b4"]
        p.addItem(pg.BarGraphItem(x=[0, 1, 2], height=heights, width=0.6, brushes=colours))
        p.addItem(pg.ErrorBarItem(x=np.array([2.0]), y=np.array([check.random_mean]),
                                  height=np.array([2 * check.random_spread]), beam=0.2, pen=pg.mkPen("k", width=2)))
        p.addItem(pg.ScatterPlotItem(x=np.full(n, 2.0) + np.linspace(-0.15, 0.15, n) if n > 1 else np.full(n, 2.0),
                                     y=np.array(check.random, dtype=float), size=6, brush="w", pen="k"))
        p.getAxis("bottom").setTicks([[(0, "clean"), (1, f"top {k} off"), (2, f"random {k} off")], []])
        p.getAxis("left").enableAutoSIPrefix(False)  # an accuracy of 0.8 stays 0.8, not 800 ×0.001
        p.setLabel("left", "accuracy" if check.what == "needle accuracy" else "loss (nats)")
        p.setMinimumHeight(BARS_MIN)
        top = max([*heights, *check.random, 1e-6])
        p.setRange(xRange=(-0.7, 2.7), yRange=(0, top * 1.15), padding=0)  # room for the last bar's label
        p.setTitle("check by ablation")  # short: a plot's title sets its least width

    # ------------------------------------------------------------------------------------ the two views
    def show_induction(self, scores: np.ndarray, check, name: str) -> None:
        self.clear()
        self._head_grid(scores, 0, 0, "induction score", "score")
        if check is not None:
            self._bars(check, 1, 0)
            self._stretch(rows=(3, 2))

    def show_retrieval(self, result, check, name: str) -> None:
        self.clear()
        acc = np.asarray(result.accuracy, dtype=np.float32)
        p = self.accuracy_plot = cell_plot(self.canvas, 0, 0)  # no colour bar: every cell is written on
        img = pg.ImageItem(axisOrder="row-major")
        p.addItem(img)
        img.setImage(np.nan_to_num(acc, nan=0.0), levels=(0.0, 1.0), autoLevels=False, lut=lut_rgb(self.cmap))
        img.setRect(QRectF(0, 0, acc.shape[1], acc.shape[0]))
        p.setLabel("left", "length")  # before the labels: an axis sizes itself for its title too
        p.setLabel("bottom", "depth")
        p.getAxis("left").set_labels([short_length(n) for n in result.lengths])
        p.getAxis("bottom").set_labels([f"{d:g}" for d in result.depths])
        p.setRange(xRange=(0, acc.shape[1]), yRange=(0, acc.shape[0]), padding=0.02)
        p.setTitle("accuracy")
        p.setMinimumHeight(GRID_MIN)
        self.accuracy, self.result = acc, result
        for i, row in enumerate(acc):  # each cell's figure, written on it where they all fit (_fit_texts)
            for j, v in enumerate(row):
                t = pg.TextItem("—" if not np.isfinite(v) else f"{v:.0%}", color="w" if v < 0.6 else "k",
                                anchor=(0.5, 0.5))
                t.setPos(j + 0.5, i + 0.5)
                p.addItem(t)
                self.cell_texts.append(t)
        p.vb.sigResized.connect(self._fit_texts)
        p.vb.sigRangeChanged.connect(self._fit_texts)
        self._head_grid(result.scores, 0, 1, "retrieval score", "score")
        # the columns share the width by what they hold: depths against heads (past 8 heads, labels thin out)
        self._stretch(cols=(2 + acc.shape[1], 2 + min(8, result.scores.shape[1])),
                      rows=(3, 2) if check is not None else None)
        if check is not None:
            self._bars(check, 1, 0, colspan=2)
        self._fit_texts()

    def _fit_texts(self, *_) -> None:
        """The cells' figures all shown, in a font as large as fits a cell (down to MIN_POINT), else none (the
        hover line says them)."""
        p = self.accuracy_plot
        if p is None or not self.cell_texts:
            return
        px = p.vb.viewPixelSize()  # one screen pixel in cells
        if px[0] <= 0 or px[1] <= 0:
            return
        w, h = 1.0 / px[0] - 2, 1.0 / px[1]  # a cell in pixels, less a pixel each side
        font = QFont()
        size = max(MIN_POINT, font.pointSizeF() - 1)
        font.setPointSizeF(size)
        fm = QFontMetricsF(font)
        need = max(fm.horizontalAdvance(t.textItem.toPlainText()) for t in self.cell_texts)
        scale = min(1.0, w / max(need, 1.0), h / fm.height())
        fits = size * scale >= MIN_POINT
        if fits:
            font.setPointSizeF(size * scale)
        for t in self.cell_texts:
            t.setFont(font)
            t.setVisible(fits)

    def _stretch(self, cols=None, rows=None) -> None:
        lay = self.canvas.ci.layout
        for i, f in enumerate(cols or ()):
            lay.setColumnStretchFactor(i, f)
        for i, f in enumerate(rows or ()):
            lay.setRowStretchFactor(i, f)

    # ------------------------------------------------------------------------------------ clicks
    def head_at(self, scene_pos) -> tuple[int, int] | None:
        if self.heads is None or self.head_plot is None:
            return None
        return cell_under(self.head_plot, scene_pos, self.heads.shape)

    def cell_at(self, scene_pos) -> tuple[int, int] | None:
        """(length row, depth column) of the accuracy cell under a scene point, or None."""
        if self.accuracy is None or self.accuracy_plot is None:
            return None
        return cell_under(self.accuracy_plot, scene_pos, self.accuracy.shape)

    def head_centre(self, layer: int, head: int):
        """Scene position of a head's cell (tests click here)."""
        return cell_centre(self.head_plot, layer, head)
