"""Pieces the analysis pages share: a labelled token heatmap panel, an L×H head grid, the page (widgets.page).

Drawing only; the numbers come from `session.analysis` (pure functions run in workers).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QRectF, Qt
from PySide6.QtWidgets import QWidget

from attn_explorer.gui.widgets.heatmap import TokenAxis, cell_centre, cell_under, colormap, follow_loading, set_bar_label
from attn_explorer.gui.widgets.page import PageFrame

DIVERGING = "CET-D1"  # blue - white - red, for signed differences


class HeatPanel:
    """One heatmap in a GraphicsLayout: token labels on both axes, its own colour bar, a title."""

    def __init__(self, canvas: pg.GraphicsLayoutWidget, row: int, col: int, cmap: str, label: str = "weight",
                 rotate: bool = True):
        self.left_axis = TokenAxis("left")
        self.bottom_axis = TokenAxis("bottom", rotate=rotate)
        self.plot = canvas.addPlot(row=row, col=col, axisItems={"left": self.left_axis, "bottom": self.bottom_axis})
        self.plot.invertY(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap(cmap), interactive=False, width=12)
        self.bar.setImageItem(self.image, insert_in=self.plot)
        set_bar_label(self.bar, label)
        self.bar.axis.enableAutoSIPrefix(False)
        self.tokens: tuple[list[str], list[str]] = ([], [])
        self.matrix: np.ndarray | None = None

    def show(self, matrix: np.ndarray, rows: list[str], cols: list[str], levels: tuple[float, float], cmap: str,
             title: str = "", label: str | None = None) -> None:
        self.matrix = np.asarray(matrix)
        n, m = self.matrix.shape
        self.bar.setColorMap(colormap(cmap))
        self.bar.setLevels(values=levels)
        if label is not None:
            set_bar_label(self.bar, label)
        self.image.setImage(self.matrix, levels=levels, autoLevels=False)
        self.image.setRect(QRectF(0, 0, m, n))
        if (list(rows), list(cols)) != self.tokens:
            self.tokens = (list(rows), list(cols))
            self.left_axis.set_labels(list(rows))
            self.bottom_axis.set_labels(list(cols))
            self.plot.getViewBox().setLimits(xMin=0, xMax=m, yMin=0, yMax=n)
            self.plot.setRange(xRange=(0, m), yRange=(0, n), padding=0)
        self.plot.setTitle(title)

    def cell_at(self, scene_pos) -> tuple[int, int] | None:
        """(row, col) under a scene position, or None."""
        return None if self.matrix is None else cell_under(self.plot, scene_pos, self.matrix.shape)

    def cell_center(self, i: int, j: int):
        """Scene position of a cell's centre (tests click here)."""
        return cell_centre(self.plot, i, j)


def peak(m: np.ndarray) -> float:
    """The top of a colour scale for non-negative values (never 0)."""
    v = float(np.max(m)) if np.size(m) else 0.0
    return v if v > 0 else 1e-6


def symmetric(m: np.ndarray) -> tuple[float, float]:
    """Levels centred on 0 for signed values."""
    v = float(np.max(np.abs(m))) if np.size(m) else 0.0
    v = v if v > 0 else 1e-6
    return -v, v


def untrained_tag(info) -> str:
    return "" if info is None or info.trained else " <b>Untrained model (random weights): patterns mean nothing.</b>"


class AnalysisPage(PageFrame):
    """An analysis page: the shared frame on a pyqtgraph canvas that draws the session's result."""

    # the page draws the session's result: until one exists, and once the input is emptied, its canvas says
    # what the window waits for, as the explorer's pages do (heatmap.follow_loading); False for a page
    # with an input of its own (the corpus)
    FOLLOWS_INPUT = True

    def __init__(self, state, parent: QWidget | None = None, content: QWidget | None = None, **frame):
        super().__init__(state, content, parent, **frame)
        state.model_loading.connect(lambda *_: self.readout.setText(""))
        if self.FOLLOWS_INPUT:
            follow_loading(state, self.stack.show_message)
            state.input_cleared.connect(lambda: self.caption.setText(""))  # it described the result that went

    def _failed(self, message: str) -> None:
        """A job failed: the caption described what is gone; the message goes in the banner, once, and the
        canvas points there."""
        self.show_failure(message)


class EscCancelsJob:
    """A page with its own long job (`self.progress.running`, `self.cancel()`): Esc cancels that job while it runs,
    rather than the window's run, whose shortcut Esc is. Put before the page's Qt base class."""

    def event(self, e) -> bool:
        if e.type() == QEvent.ShortcutOverride and e.key() == Qt.Key_Escape and self.progress.running:
            e.accept()
            return True
        return super().event(e)

    def keyPressEvent(self, e) -> None:
        if e.key() == Qt.Key_Escape and self.progress.running:
            self.cancel()
            return
        super().keyPressEvent(e)


def cell_plot(canvas: pg.GraphicsLayoutWidget, row: int, col: int) -> pg.PlotItem:
    """A plot for an L×H grid of cells (layer down, head across), fixed in place; `label_cells` numbers it."""
    p = canvas.addPlot(row=row, col=col, axisItems={"left": TokenAxis("left"), "bottom": TokenAxis("bottom")})
    p.invertY(True)
    p.setMenuEnabled(False)
    p.hideButtons()
    p.setMouseEnabled(x=False, y=False)
    return p


def label_cells(plot: pg.PlotItem, rows: int, cols: int) -> None:
    """Layer numbers down and head numbers across an L×H grid, each at its cell's centre; as many as fit
    without running into each other (a plot made by `cell_plot`: its axes thin their own labels)."""
    for side, n in (("left", rows), ("bottom", cols)):
        axis = plot.getAxis(side)
        labels = [str(i) for i in range(n)]
        if isinstance(axis, TokenAxis):
            if axis._labels != labels:
                axis.set_labels(labels)
        else:
            axis.setTicks([[(i + 0.5, t) for i, t in enumerate(labels)], []])
