"""One model's heads as points (the Atlas page's scatter): a point per head, coloured by layer with a colour bar
labelled "layer" as its legend, a ring on the selected head and, when two atlases are matched, a ring of
another colour on the head matched to the other side's selection.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF

LAYER_MAP = "viridis"
SELECTED_PEN = pg.mkPen("#d32f2f", width=2.5)  # red ring: the head clicked
MATCH_PEN = pg.mkPen("#ff6f00", width=2.5, style=pg.QtCore.Qt.DashLine)  # orange dashed ring: its match
HIT_PX = 9  # a hover or click within this many pixels of a point is on it
TITLE_PX = 200  # a longer plot title wraps at this width (or its plot's, when wider)


def set_title(plot: pg.PlotItem, text: str) -> None:
    """A plot's title that never widens its plot: a narrow plot clips its title rather than pushing its colour
    bar out of sight (pyqtgraph makes a title's width the plot's minimum)."""
    plot.setTitle(text, size="9pt")
    label = plot.titleLabel
    label.item.setTextWidth(-1)
    room = max(TITLE_PX, plot.width() - 80)  # a plot already laid out wide keeps its title on one line
    if label.item.boundingRect().width() > room:
        label.item.setTextWidth(room)  # a longer one wraps
    label.updateMin()


class HeadScatter:
    """Points for L × H heads in one plot of a GraphicsLayout (row, col), its colour bar at col + 1."""

    def __init__(self, canvas: pg.GraphicsLayoutWidget, row: int, col: int, on_click: Callable[[int, int], None]):
        self.plot = canvas.addPlot(row=row, col=col)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.showGrid(x=True, y=True, alpha=0.15)
        for side in ("left", "bottom"):
            self.plot.getAxis(side).enableAutoSIPrefix(False)  # shares stay 0.4, not 400 (x0.001)
        self.points = pg.ScatterPlotItem(size=9, pen=pg.mkPen("#333", width=0.5), hoverable=False)
        self.ring = pg.ScatterPlotItem(size=18, pen=SELECTED_PEN, brush=None, symbol="o")
        self.match_ring = pg.ScatterPlotItem(size=22, pen=MATCH_PEN, brush=None, symbol="o")
        for item in (self.points, self.match_ring, self.ring):
            self.plot.addItem(item)
        self.bar = pg.ColorBarItem(values=(0, 1), colorMap=pg.colormap.get(LAYER_MAP), interactive=False, width=10,
                                   label="layer")
        canvas.addItem(self.bar, row=row, col=col + 1)
        self.bar.axis.enableAutoSIPrefix(False)
        self.shape = (0, 0)
        self.xy = np.zeros((0, 2))
        self.points.sigClicked.connect(lambda _item, pts, *_: self._clicked(pts, on_click))

    # ------------------------------------------------------------------------------------------ drawing
    def show(self, xy: np.ndarray, shape: tuple[int, int], xlabel: str, ylabel: str, title: str) -> None:
        """Place the L × H heads (xy rows layer-major); NaN coordinates are not drawn."""
        L, H = shape
        self.shape, self.xy = (L, H), np.asarray(xy, dtype=np.float64)
        layer = np.repeat(np.arange(L), H)
        cmap = pg.colormap.get(LAYER_MAP)
        brushes = cmap.map(layer / max(1, L - 1), mode="qcolor")
        ok = np.all(np.isfinite(self.xy), axis=1)
        idx = np.flatnonzero(ok)
        self.points.setData(x=self.xy[ok, 0], y=self.xy[ok, 1], brush=[brushes[i] for i in idx], data=idx)
        self.bar.setLevels(values=(0, max(1, L - 1)))
        self.plot.setLabel("bottom", xlabel)
        self.plot.setLabel("left", ylabel)
        set_title(self.plot, title)
        self.plot.autoRange()

    def clear(self, title: str = "") -> None:
        self.shape, self.xy = (0, 0), np.zeros((0, 2))
        for item in (self.points, self.ring, self.match_ring):
            item.setData(x=[], y=[])
        set_title(self.plot, title)
        self.plot.setLabel("bottom", "")
        self.plot.setLabel("left", "")

    def select(self, head: tuple[int, int] | None) -> None:
        self._ring(self.ring, head)

    def mark_match(self, head: tuple[int, int] | None) -> None:
        self._ring(self.match_ring, head)

    def _ring(self, item: pg.ScatterPlotItem, head) -> None:
        i = self.index(head)
        if i is None or not np.all(np.isfinite(self.xy[i])):
            item.setData(x=[], y=[])
        else:
            item.setData(x=[self.xy[i, 0]], y=[self.xy[i, 1]])

    # ------------------------------------------------------------------------------------------ finding heads
    def index(self, head) -> int | None:
        L, H = self.shape
        if head is None or not (0 <= head[0] < L and 0 <= head[1] < H):
            return None
        return head[0] * H + head[1]

    def head_of(self, i: int) -> tuple[int, int]:
        return divmod(int(i), self.shape[1])

    def head_at(self, scene_pos) -> tuple[int, int] | None:
        """The head whose point is within HIT_PX pixels of a scene position, or None."""
        if not len(self.xy) or not self.plot.sceneBoundingRect().contains(scene_pos):
            return None
        vb = self.plot.getViewBox()
        ok = np.flatnonzero(np.all(np.isfinite(self.xy), axis=1))
        if not len(ok):
            return None
        px = np.array([[p.x(), p.y()] for p in (vb.mapViewToScene(QPointF(*self.xy[i])) for i in ok)])
        d = np.hypot(px[:, 0] - scene_pos.x(), px[:, 1] - scene_pos.y())
        j = int(np.argmin(d))
        return self.head_of(ok[j]) if d[j] <= HIT_PX else None

    def scene_pos_of(self, head) -> QPointF:
        """Scene position of a head's point (tests click here)."""
        i = self.index(head)
        return self.plot.getViewBox().mapViewToScene(QPointF(*self.xy[i]))

    def _clicked(self, pts, on_click) -> None:
        if len(pts):
            on_click(*self.head_of(pts[0].data()))
