"""Pieces the analysis pages share: a labelled token heatmap panel, an L×H head grid, the page frame.

Drawing only; the numbers come from `session.analysis` (pure functions run in workers).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Signal
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from attn_explorer.gui.widgets.heatmap import (CanvasStack, LazyPage, PaintedGraphicsWidget, TokenAxis, cell_centre,
                                       cell_under, colormap, set_bar_label)

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


class AnalysisPage(LazyPage, QWidget):
    """A page frame: a caption line, a bar of controls, a canvas that a message can replace, a read-out."""

    head_opened = Signal(int, int)  # layer, head: the user asked to see that head

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        self.readout = QLabel("")
        self.readout.setStyleSheet("font-family: monospace;")
        self.canvas = PaintedGraphicsWidget()
        self.stack = CanvasStack(self.canvas)
        self.bar_layout = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.page_layout = lay
        state.model_loading.connect(self._loading)

    def finish_layout(self, bar) -> None:
        """Caption, controls, canvas and read-out, top to bottom."""
        self.page_layout.addWidget(self.caption)
        if bar is not None:
            self.page_layout.addLayout(bar)
        self.page_layout.addWidget(self.stack, 1)
        self.page_layout.addWidget(self.readout)

    def _loading(self, src: str) -> None:
        self.readout.setText("")
        if self.state.result is None:
            self.stack.show_message(f"Loading {src or 'the model'}…")

    def _failed(self, message: str) -> None:
        """A job failed: the caption described what is gone; the message goes on the canvas and in the banner."""
        self.caption.setText("")
        self.stack.show_message(message)
        self.state.error_raised.emit(message)

    def open_head(self, layer: int, head: int) -> None:
        self.state.select(layer, head)
        self.head_opened.emit(int(layer), int(head))


def label_cells(plot: pg.PlotItem, rows: int, cols: int) -> None:
    """Layer numbers down and head numbers across an L×H grid, each at its cell's centre."""
    def ticks(n: int):
        step = max(1, int(np.ceil(n / 12)))
        return [[(i + 0.5, str(i)) for i in range(0, n, step)], []]

    plot.getAxis("left").setTicks(ticks(rows))
    plot.getAxis("bottom").setTicks(ticks(cols))
