"""Shared pieces of the heatmap views, after pyqtgraph's MatrixDisplayExample.

`ImageItem(axisOrder="row-major")` in a `PlotItem` with `invertY(True)`, token labels set on the axes,
and one `ColorBarItem`. `TokenAxis` also draws labels turned on their side, so a bottom axis can carry
one word per column without the words running into each other.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import QLabel, QStackedWidget, QWidget

from attn_explorer.maths import display_values

COLORMAPS = ["viridis", "magma", "inferno", "plasma", "cividis", "turbo", "CET-L17", "CET-L3"]


def configure_pyqtgraph() -> None:
    """Light plots with dark text, set once by the app factory."""
    pg.setConfigOptions(background="w", foreground="#222", antialias=False)


@lru_cache(maxsize=32)
def colormap(name: str) -> pg.ColorMap:
    try:
        return pg.colormap.get(name)
    except (OSError, ValueError, IndexError):  # an unknown name from old settings: no such file, an empty name,
        return pg.colormap.get("viridis")  # or a path ("./x") to a file that is no colour map


@lru_cache(maxsize=32)
def lut_rgb(name: str) -> np.ndarray:
    """(256, 3) uint8 lookup table, for blending heat over photos in NumPy."""
    return colormap(name).getLookupTable(0.0, 1.0, 256, alpha=False, mode="byte")[:, :3].astype(np.uint8)


def add_heat_image(plot: pg.PlotItem, cmap_name: str) -> tuple[pg.ImageItem, pg.ColorBarItem]:
    """A row-major ImageItem in plot with its colour bar beside it (weights 0..1 to start)."""
    image = pg.ImageItem(axisOrder="row-major")
    plot.addItem(image)
    bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap(cmap_name), interactive=False, width=14)
    bar.setImageItem(image, insert_in=plot)
    set_bar_label(bar, scale_label(False))
    return image, bar


def set_bar_label(bar: pg.ColorBarItem, text: str) -> None:
    """The colour bar's one title, on its value axis (pyqtgraph's own `label=` goes on the frame's other
    side, so setting both gave two titles)."""
    for key in ("left", "top", "bottom"):
        bar.getAxis(key).showLabel(False)
    bar.axis.setLabel(text)


def style_colorbar(bar: pg.ColorBarItem, cmap_name: str, log: bool) -> None:
    """Colormap, value range and title of a weight colour bar, for linear or log10 weights."""
    bar.setColorMap(colormap(cmap_name))
    bar.setLevels(values=display_values(np.zeros(1), log)[1])
    set_bar_label(bar, scale_label(log))


def scale_label(log: bool) -> str:
    return "log₁₀ weight" if log else "weight"


def picture_panel(canvas: pg.GraphicsLayoutWidget, row: int, col: int, cmap: str,
                  label: str | None = None) -> tuple[pg.PlotItem, pg.ImageItem, pg.ColorBarItem]:
    """A picture with a heat overlay: a plot at (row, col) with no axes or menu, its image (row-major,
    y down, square pixels), and a colour bar in the next column (its own ticks, no SI prefix)."""
    plot = canvas.addPlot(row=row, col=col)
    plot.invertY(True)
    plot.setAspectLocked(True)
    for side in ("left", "bottom"):
        plot.hideAxis(side)
    plot.setMenuEnabled(False)
    plot.hideButtons()
    image = pg.ImageItem(axisOrder="row-major")
    plot.addItem(image)
    bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap(cmap), interactive=False, width=12)
    bar.axis.enableAutoSIPrefix(False)
    bar.axis.setWidth(None)  # wide enough for "0.007" and the title beside it
    if label is not None:
        set_bar_label(bar, label)
    canvas.addItem(bar, row=row, col=col + 1)
    return plot, image, bar


def cell_under(plot: pg.PlotItem, scene_pos, shape: tuple[int, int]) -> tuple[int, int] | None:
    """(row, col) of the cell under a scene position in a plot drawn one unit per cell, or None outside."""
    if not plot.vb.sceneBoundingRect().contains(scene_pos):
        return None
    p = plot.vb.mapSceneToView(scene_pos)
    i, j = int(np.floor(p.y())), int(np.floor(p.x()))
    n, m = shape
    return (i, j) if 0 <= i < n and 0 <= j < m else None


def cell_centre(plot: pg.PlotItem, i: int, j: int):
    """Scene position of the centre of cell (row i, col j) in a plot drawn one unit per cell (tests click here)."""
    return plot.vb.mapViewToScene(pg.Point(j + 0.5, i + 0.5))


def short(token: str, width: int = 14) -> str:
    """A label cut to `width` characters; a newline drawn as ↵, as `tokens.token_text` draws it."""
    t = token.replace("\n", "↵")
    return t if len(t) <= width else t[: width - 1] + "…"


class TokenAxis(pg.AxisItem):
    """An axis of token labels, one per unit (token i spans [i, i+1)); bottom axes draw them turned 90°.

    Which labels are drawn depends on the visible range and the axis' size in pixels: every k-th token
    (k a whole number, labels at multiples of k so they stay put while panning), with k the smallest
    step that keeps labels a line's height apart. Zoom in and every token gets its label.
    """

    TICK_SPACE = 110  # most pixels the tick labels take across the axis (14 characters)
    MIN_POINT_SIZE = 6.0  # `fit_every_label`: the smallest font the labels shrink to

    def __init__(self, orientation: str, rotate: bool = False, **kw):
        super().__init__(orientation, **kw)
        self._rotate = rotate and orientation in ("top", "bottom")
        self._labels: list[str] = []
        self._widest = 0  # pixels of the widest label
        # long inputs: while a token cannot have a line of its own, label positions (0, 500, 1000...) instead
        # of every k-th token; once there is room for one a line, every token is named
        self.numbers_when_crowded = False
        # a few labels that must all be read (the bars of a chart): a smaller font rather than every k-th label
        self.fit_every_label = False
        # a column left of token 0 with a label of its own (gpt-oss's "sink", drawn at -1..0)
        self.lead_label: str | None = None
        self._tick_space = 20
        self.setTicks([[], []])

    def _font(self):
        base = self.style["tickFont"] or self.font()
        if not self.fit_every_label or not self._labels:
            return base
        lo, hi = sorted(self.range)
        length = self._along()
        if hi <= lo or length <= 0:
            return base
        per_label = length / (hi - lo)  # pixels along the axis for one token
        line = QFontMetrics(base).height() + 1
        if line <= per_label:
            return base
        font = QFont(base)
        size = base.pointSizeF() if base.pointSizeF() > 0 else base.pixelSize() * 0.75
        font.setPointSizeF(max(self.MIN_POINT_SIZE, size * (per_label - 1) / (line - 1)))
        return font

    def set_labels(self, labels: list[str]) -> None:
        self._labels = [short(t) for t in labels]
        fm = QFontMetrics(self._font())
        widest = max((fm.horizontalAdvance(t) for t in self._labels), default=20)
        self._widest = widest if self._labels else 0
        title = self.label.boundingRect().height() if self.label.isVisible() else 0
        if self.orientation in ("top", "bottom"):
            self._tick_space = min(self.TICK_SPACE, widest + 14) if self._rotate else fm.height() + 8
            self.setHeight(int(self._tick_space + title))
        else:
            self._tick_space = min(self.TICK_SPACE + 40, widest + 14)
            self.setWidth(int(self._tick_space + title))
        self.picture = None
        self.update()

    def _along(self) -> float:
        rect = self.mapRectFromParent(self.geometry())
        return rect.width() if self.orientation in ("top", "bottom") else rect.height()

    def _to_px(self, v: float, length: float) -> float:
        """Axis value -> pixels along the axis, as pyqtgraph's own tick layout maps it."""
        lo, hi = self.range
        if hi == lo:
            return 0.0
        if self.orientation in ("top", "bottom"):
            return (v - lo) / (hi - lo) * length
        return length - (v - lo) / (hi - lo) * length

    def _room(self) -> float:
        """Pixels one label needs along the axis."""
        fm = QFontMetrics(self._font())
        if self.orientation in ("top", "bottom") and not self._rotate:  # side by side: a label's width apart
            return self._widest + 6
        return fm.height() + 1  # stacked (left axes, turned labels): a line's height apart

    def token_step(self) -> int:
        """Every how many tokens a label fits for the current range and size (1: every token has one)."""
        n, length = len(self._labels), self._along()
        lo, hi = sorted(self.range)
        if n == 0 or hi <= lo or length <= 0:
            return 0
        return max(1, math.ceil(self._room() / (length / (hi - lo))))

    def tokens_that_fit(self) -> int:
        """How many tokens the axis can name at once, one label each (its length over a label's room)."""
        return max(1, int(self._along() // max(1.0, self._room())))

    def labels_every_token(self) -> bool:
        """Every visible token has its own label now (there is room for one a line)."""
        return self.token_step() == 1

    def drawn_labels(self) -> list[tuple[float, str]]:
        """(pixels along the axis, text) of every label drawn for the current range and size."""
        step = self.token_step()
        if not step:
            return []
        n, length = len(self._labels), self._along()
        lo, hi = sorted(self.range)
        numbers = self.numbers_when_crowded and step > 1
        if numbers:  # positions at round steps, a few lines apart (a number a line reads as a wall of digits)
            room = 3 * self._room()
            if self.orientation in ("top", "bottom") and not self._rotate:
                room = QFontMetrics(self._font()).horizontalAdvance(str(n)) + 16
            step = nice_step(room / (length / (hi - lo)))
        first = max(0, int(math.floor(lo)) // step * step)
        last = min(n - 1, int(math.ceil(hi)))
        out = []
        for i in range(first, last + 1, step):
            px = self._to_px(i + 0.5, length)
            if -1 <= px <= length + 1:
                out.append((px, str(i) if numbers else self._labels[i]))
        if self.lead_label and lo < 0:
            px = self._to_px(-0.5, length)
            if -1 <= px <= length + 1:
                out.insert(0, (px, self.lead_label))
        return out

    def tick_text_extent(self) -> float:
        """Pixels from the axis line to where the longest drawn label ends (rotated bottom axes)."""
        fm = QFontMetrics(self._font())
        widest = max((fm.horizontalAdvance(t) for _, t in self.drawn_labels()), default=0)
        return 6 + min(widest, self._tick_space - 8)

    def drawPicture(self, p, axisSpec, tickSpecs, textSpecs):  # noqa: N802 - pyqtgraph API
        super().drawPicture(p, axisSpec, [], [])
        p.setClipping(False)  # the first and last labels may reach half a line past the axis ends
        p.setFont(self._font())
        fm = QFontMetrics(self._font())
        fh = fm.height()
        rect = self.mapRectFromParent(self.geometry())
        rect.moveTo(0, 0)
        box = self._tick_space - 8
        p.setPen(self.textPen())
        for px, text in self.drawn_labels():
            p.save()
            if self.orientation == "bottom":
                p.drawLine(QPointF(px, 0), QPointF(px, 3))
                if self._rotate:
                    p.translate(px, 6)
                    p.rotate(-90)
                    p.drawText(QRectF(-box, -fh / 2, box, fh), int(Qt.AlignRight | Qt.AlignVCenter), text)
                else:
                    p.drawText(QRectF(px - 60, 5, 120, fh), int(Qt.AlignHCenter | Qt.AlignTop), text)
            elif self.orientation == "top":
                p.translate(px, rect.height() - 6)
                p.rotate(-90)
                p.drawText(QRectF(0, -fh / 2, box, fh), int(Qt.AlignLeft | Qt.AlignVCenter), text)
            else:  # left
                right = rect.width()
                p.drawLine(QPointF(right - 3, px), QPointF(right, px))
                box_rect, shown = self.left_label_box(px, text)
                p.drawText(box_rect, int(Qt.AlignRight | Qt.AlignVCenter), shown)
            p.restore()

    def left_label_box(self, px: float, text: str) -> tuple[QRectF, str]:
        """Where a left axis draws a label, and the text it draws: inside the axis, right-aligned to the tick;
        a label wider than the axis is given (a layout that squeezes the axis) loses its end to "…", never its
        first characters past the axis' left edge."""
        fm = QFontMetrics(self._font())
        right = self.mapRectFromParent(self.geometry()).width()
        box = max(0.0, min(self._tick_space - 8, right - 6))
        if fm.horizontalAdvance(text) > box:
            text = fm.elidedText(text, Qt.ElideRight, int(box))
        return QRectF(right - 6 - box, px - fm.height() / 2, box, fm.height()), text


def nice_step(at_least: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50... that is at least `at_least` (round label steps)."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if step * m >= at_least:
                return step * m
        step *= 10


NO_MODEL = "No model is loaded: the message above says why. Pick one in the Model box."


def follow_loading(state, show: Callable[[str], None]) -> None:
    """Until a first result exists, keep `show(text)` saying what the window waits for: the model being
    loaded; once it has loaded, its first run on the input the box already holds (the sample at start-up),
    or, with nothing to run, what to type; after a failure, what to do (or, with no model at all, that there
    is none). Every page that waits for the session's result (explorer and analysis pages) uses it."""
    state.model_loading.connect(lambda src: show(f"Loading {src or 'the model'}…") if state.result is None else None)
    state.error_raised.connect(lambda *_: show(NO_MODEL if state.info is None else waiting_for_input(state.info))
                               if state.result is None else None)
    state.model_loaded.connect(lambda info: show(f"Running {info.name} on the input…" if state.has_input
                                                 else waiting_for_input(info)) if state.result is None else None)
    # a first run in flight (nothing drawn yet): what runs, layer by layer, not what to type (issue 24 D)
    state.run_progressed.connect(lambda _done, _total, line: show(line[:1].upper() + line[1:])
                                 if state.result is None and line else None)
    # the input was emptied: the maps go, and the page says what to do (InputState.input_cleared)
    state.input_cleared.connect(lambda: show(waiting_for_input(state.info)) if state.info is not None else None)


def waiting_for_input(info) -> str:
    """What a page says when its model is loaded but there is nothing to run yet (empty text)."""
    what = "open or drop a picture" if info.modality == "image" else "type or paste some text"
    return f"{info.name} is loaded: {what} to see its attention."


class CanvasStack(QStackedWidget):
    """A page's plot canvas, or in its place one centred line (loading, nothing to show yet)."""

    def __init__(self, canvas: QWidget, message: str = "Loading the model…", parent: QWidget | None = None):
        super().__init__(parent)
        self.placeholder = QLabel(message)
        self.placeholder.setAlignment(Qt.AlignCenter)
        self.placeholder.setWordWrap(True)
        self.placeholder.setStyleSheet("color: #666; font-size: 15px;")
        self.canvas = canvas
        self.addWidget(self.placeholder)
        self.addWidget(canvas)

    def show_message(self, text: str) -> None:
        self.placeholder.setText(text)
        self.setCurrentWidget(self.placeholder)

    def show_canvas(self) -> None:
        self.setCurrentWidget(self.canvas)


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

    def result_to_draw(self):
        """The session's result, or None when there is nothing to draw now: no run yet, or the page is hidden
        (then it is marked stale and draws when shown)."""
        if not self.needs_draw():
            return None
        return self.state.result

    def showEvent(self, ev):  # noqa: N802 - Qt API
        super().showEvent(ev)
        if self._stale and self.state.result is not None:
            self._stale = False
            self.redraw()
