"""Shared pieces of the heatmap views, after pyqtgraph's MatrixDisplayExample.

`ImageItem(axisOrder="row-major")` in a `PlotItem` with `invertY(True)`, token labels set on the axes,
and one `ColorBarItem`. `TokenAxis` also draws labels turned on their side, so a bottom axis can carry
one word per column without the words running into each other.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QFontMetrics

COLORMAPS = ["viridis", "magma", "inferno", "plasma", "cividis", "turbo", "CET-L17", "CET-L3"]
LOG_FLOOR = -4.0  # log10 of the smallest weight the log scale shows



def configure_pyqtgraph() -> None:
    """Light plots with dark text, set once by the app factory."""
    pg.setConfigOptions(background="w", foreground="#222", antialias=False)


@lru_cache(maxsize=32)
def colormap(name: str) -> pg.ColorMap:
    try:
        return pg.colormap.get(name)
    except Exception:  # noqa: BLE001 - unknown name from old settings
        return pg.colormap.get("viridis")


@lru_cache(maxsize=32)
def lut_rgb(name: str) -> np.ndarray:
    """(256, 3) uint8 lookup table, for blending heat over photos in NumPy."""
    return colormap(name).getLookupTable(0.0, 1.0, 256, alpha=False, mode="byte")[:, :3].astype(np.uint8)


def add_heat_image(plot: pg.PlotItem, cmap_name: str) -> tuple[pg.ImageItem, pg.ColorBarItem]:
    """A row-major ImageItem in plot with its colour bar beside it (weights 0..1 to start)."""
    image = pg.ImageItem(axisOrder="row-major")
    plot.addItem(image)
    bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap(cmap_name), label="weight", interactive=False, width=14)
    bar.setImageItem(image, insert_in=plot)
    return image, bar


def display_values(a: np.ndarray, log: bool) -> tuple[np.ndarray, tuple[float, float]]:
    """Values to draw and their colour levels: weights in [0, 1], or log10 weights in [LOG_FLOOR, 0]."""
    if not log:
        return a, (0.0, 1.0)
    with np.errstate(divide="ignore"):
        return np.log10(np.maximum(a, 10.0**LOG_FLOOR)), (LOG_FLOOR, 0.0)


def scale_label(log: bool) -> str:
    return "log₁₀ weight" if log else "weight"


def short(token: str, width: int = 14) -> str:
    t = token.replace("\n", "⏎")
    return t if len(t) <= width else t[: width - 1] + "…"


def thin_ticks(labels: list[str], max_labels: int) -> list[tuple[float, str]]:
    """Ticks at pixel centres (i + 0.5), every k-th label so at most max_labels are drawn."""
    n = len(labels)
    step = max(1, math.ceil(n / max(1, max_labels)))
    return [(i + 0.5, short(labels[i])) for i in range(0, n, step)]


class TokenAxis(pg.AxisItem):
    """An axis that shows token labels; top/bottom axes can draw them rotated by 90°."""

    def __init__(self, orientation: str, rotate: bool = False, **kw):
        super().__init__(orientation, **kw)
        self._rotate = rotate and orientation in ("top", "bottom")
        self._labels: list[str] = []

    def set_labels(self, labels: list[str], max_labels: int = 64) -> None:
        self._labels = [short(t) for t in labels]
        ticks = thin_ticks(labels, max_labels)
        self.setTicks([ticks, []])
        if self._rotate:
            fm = QFontMetrics(self.font())
            widest = max((fm.horizontalAdvance(t) for t in self._labels), default=20)
            self.setHeight(min(110, widest + 14))
        self.update()

    def drawPicture(self, p, axisSpec, tickSpecs, textSpecs):  # noqa: N802 - pyqtgraph API
        if not self._rotate:
            return super().drawPicture(p, axisSpec, tickSpecs, textSpecs)
        super().drawPicture(p, axisSpec, tickSpecs, [])
        n = len(self._labels)
        lo, hi = self.range
        span = hi - lo
        rect = self.boundingRect()
        w = rect.width()
        if n == 0 or span <= 0 or w <= 0:
            return
        fm = QFontMetrics(p.font())
        per_token = w / span
        step = max(1, math.ceil((fm.height() + 1) / per_token))
        p.setPen(self.textPen())
        box_w = rect.height() - 8
        for i in range(0, n, step):
            x = (i + 0.5 - lo) / span * w
            if x < -1 or x > w + 1:
                continue
            p.save()
            if self.orientation == "bottom":
                p.translate(x, 6)
                p.rotate(-90)
                p.drawText(QRectF(-box_w, -fm.height() / 2, box_w, fm.height()),
                           int(Qt.AlignRight | Qt.AlignVCenter), self._labels[i])
            else:
                p.translate(x, rect.height() - 6)
                p.rotate(-90)
                p.drawText(QRectF(0, -fm.height() / 2, box_w, fm.height()),
                           int(Qt.AlignLeft | Qt.AlignVCenter), self._labels[i])
            p.restore()


class PaintedGraphicsWidget(pg.GraphicsLayoutWidget):
    """A GraphicsLayoutWidget that says when it has painted (for render timing and benchmarks)."""

    painted = Signal()

    def paintEvent(self, ev):  # noqa: N802 - Qt API
        super().paintEvent(ev)
        self.painted.emit()


class LazyPage:
    """Mixin for pages: skip redraws while hidden, catch up when shown (only the visible page pays)."""

    _stale = False

    def redraw(self) -> None:
        """Draw the current result again; pages whose refresh() does that need not override it."""
        self.refresh()

    def needs_draw(self) -> bool:
        if self.isVisible():
            return True
        self._stale = True
        return False

    def showEvent(self, ev):  # noqa: N802 - Qt API
        super().showEvent(ev)
        if self._stale and self.state.result is not None:
            self._stale = False
            self.redraw()
