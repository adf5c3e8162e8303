"""A long input's map on the head page (session.long_view.windowed: a lazy run, whose maps were never kept).

It is never drawn from a whole map. The worker lanes pool the whole map to the view's pixels (the base),
and every zoom or pan, once it has settled, asks again for the visible window, at full resolution once it
fits the pixels; the window is drawn over the base. The newest ask wins: an answer for another run, head
or window is dropped. A long run's next part (issue 24 C: one more layer done) is the same run for a layer that
was already done (session.long_view.same_layer): what is drawn of it stays, and answers asked of an earlier part
are taken.
"""
from __future__ import annotations

import pyqtgraph as pg
import dataclasses
import html

from PySide6.QtCore import QObject, QRectF, QTimer, Signal

from attn_explorer.gui.explorer.mixer_marks import diverging_colormap
from attn_explorer.gui.widgets.heatmap import colormap
from attn_explorer.session.mixers import signed_scaled
from attn_explorer.session.long_view import (WINDOW_LANE, Scaled, Window, WindowAsk, colour_scale, layer_key,
                                             result_tag, same_layer, visible_ask, window_job)
from attn_explorer.session.live_run import incomplete
from attn_explorer.session.state import SessionState

ASK_DELAY_MS = 40  # zoom and pan settle this long before the window is asked for again
BASE_LANE = WINDOW_LANE + ":whole"  # the whole map pooled to the screen, under the window
PREVIOUS = "these maps are the previous input's"  # a page's maps while a new input's run is in flight (issue 24 D)


def marked(state: SessionState, text: str) -> str:
    """A page's header with "these maps are the previous input's (running …: layer k of L …)" below it while a new
    input's run of the model shown is in flight, and without it otherwise (an earlier mark is replaced)."""
    text = text.split(f"<br><b>{PREVIOUS}")[0]
    r, info = state.result, state.info
    if (not text or r is None or info is None or r.model != info.name or not state.busy
            or state.run_status() is None or incomplete(r)):
        return text
    return f"{text}<br><b>{PREVIOUS}</b> <i>({html.escape(state.watch.line())})</i>"


class LongMap(QObject):
    """The base and the window of the long map on screen, asked of the worker lanes and drawn into the plot's
    two image items (`base_image` under `image`). `changed` says there is something new to paint."""

    changed = Signal()

    def __init__(self, state: SessionState, plot: pg.PlotItem, base_image: pg.ImageItem, image: pg.ImageItem,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self.plot = plot
        self.base_image = base_image
        self.image = image
        self.head: tuple | None = None  # (run tag, layer, head) of the long map on screen (None: none is)
        self.window: Window | None = None  # the visible window's answer drawn over the base
        self.base: Window | None = None  # the whole map pooled to the screen
        self.asked: WindowAsk | None = None  # the newest window asked for (drawn or on its way)
        self.base_asked: WindowAsk | None = None  # the newest whole map asked for
        self.key = None  # session.long_view.layer_key of the layer shown: a weak reference, it holds nothing
        self.alias: set[int] = set()  # run tags of the parts of the run shown (issue 24 C): their answers count
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(ASK_DELAY_MS)
        self.timer.timeout.connect(self.ask_window)

    def forget(self) -> None:
        """No long map is on screen any more (a short input's map, or none): answers on their way are dropped."""
        self.head = self.key = None
        self.alias = set()
        self.window = self.base = self.asked = None

    def cancel(self) -> None:
        """Drop the window and the whole map on their way (the input was emptied)."""
        for lane in (WINDOW_LANE, BASE_LANE):
            self.state.cancel(lane)

    def show(self, r, l: int, h: int, new_tokens: bool) -> None:
        """Draw head (l, h) of run r: another head or new tokens start again from the whole map, pooled."""
        head = (result_tag(r), l, h)
        if (not new_tokens and head != self.head and self.head is not None and self.head[1:] == (l, h)
                and same_layer(self.key, r, l)):
            self._retag(head[0])  # the run's next part: this layer was already done, what is drawn stays
            return
        if head != self.head or new_tokens:
            self.head = head
            self.key, self.alias = layer_key(r, l), {head[0]}
            self.window = self.base = self.asked = None
            self.image.clear()
            self.base_image.clear()
            self.state.cancel(WINDOW_LANE)
            self.ask_base(r, l, h)

    def _retag(self, tag: int) -> None:
        """The same layer of the same run under a newer part's tag: the drawn answers and the asks follow it."""
        self.alias.add(tag)
        self.head = (tag, *self.head[1:])
        self.window, self.base = (None if w is None else self._tagged(w) for w in (self.window, self.base))
        self.asked, self.base_asked = (None if a is None else dataclasses.replace(a, tag=tag)
                                       for a in (self.asked, self.base_asked))

    def _tagged(self, win: Window) -> Window:
        return dataclasses.replace(win, ask=dataclasses.replace(win.ask, tag=self.head[0]))

    def ask_soon(self) -> None:
        """A zoom, pan or resize: ask for the visible window once the view has settled."""
        self.timer.start()

    def pixels(self) -> tuple[int, int]:
        vb = self.plot.vb
        return max(16, int(vb.height())), max(16, int(vb.width()))

    def ask_base(self, r, l: int, h: int) -> None:
        n = r.num_tokens
        ask = self.base_asked = visible_ask(r, l, h, (0, n), (0, n), self.pixels())
        self.state.submit(window_job, r, ask, key=BASE_LANE, uses_model=False,
                          on_result=lambda win: self.window_arrived(win, base=True))

    def visible_ask(self) -> WindowAsk | None:
        """The window the view shows now, as it would ask for it (None: no long map on screen)."""
        r = self.state.result
        if r is None or self.head is None or self.head[0] != result_tag(r):
            return None
        (x0, x1), (y0, y1) = self.plot.vb.viewRange()
        return visible_ask(r, self.head[1], self.head[2], (x0, x1), (y0, y1), self.pixels())

    def ask_window(self) -> None:
        ask = self.visible_ask()
        if ask is None:
            return
        n = self.state.result.num_tokens
        if ask.rows == (0, n) and ask.cols == (0, n):  # the whole map: the base shows it
            base = self.base.ask if self.base is not None else self.base_asked
            if base is None or base.cells != ask.cells:  # the view was resized: pool to its pixels again
                self.ask_base(self.state.result, ask.layer, ask.head)
            self.state.cancel(WINDOW_LANE)
            self.asked = None
            if self.window is not None:
                self.window = None
                self.image.clear()
                self.changed.emit()
            return
        if ask == self.asked:
            return
        self.asked = ask
        self.state.submit(window_job, self.state.result, ask, key=WINDOW_LANE, uses_model=False,
                          on_result=lambda win: self.window_arrived(win))

    def window_arrived(self, win: Window, base: bool = False) -> None:
        """An answer of the window lane: drawn only if it is for the run, head and window shown now."""
        r = self.state.result
        if (r is None or self.head is None or win.ask.tag not in self.alias
                or (win.ask.layer, win.ask.head) != self.head[1:]):
            return  # another run or head: dropped
        if self.head[0] != result_tag(r):
            return
        win = self._tagged(win)  # asked of an earlier part of this run, maybe
        if base:
            if win.ask != self.base_asked:
                return  # pooled for another size of the view: its newer ask is on the way
            self.base = win
        elif win.ask == self.asked:
            self.window = win
        else:
            return  # the view moved on since it was asked
        self.changed.emit()

    def paint(self, mode: str, log: bool, cmap: str, signed: str = "") -> tuple[Scaled, Window] | None:
        """Colour the base and the window by this colour scale (one colour bar: the window's levels for both).
        Returns the top one's scaled values and the window they came from; None while neither has come.
        `signed` (a recurrent layer's "implicit attention (...)"): the diverging scale, symmetric around 0."""
        top = None
        for win, item in ((self.base, self.base_image), (self.window, self.image)):
            if win is None:
                continue
            scaled = (signed_scaled(win.values, signed + ("; a pooled cell shows its block's max" if win.pooled else ""))
                      if signed else colour_scale(win.values, mode, log))
            top = scaled
            item.setLookupTable((diverging_colormap() if signed else colormap(cmap)).getLookupTable(0.0, 1.0, 256))
            item.setImage(scaled.values, levels=scaled.levels, autoLevels=False)
            a, b = win.ask.rows
            c, d = win.ask.cols
            item.setRect(QRectF(c, a, d - c, b - a))
        if self.window is None:
            self.image.clear()
        if top is None:
            return None
        if self.window is not None and self.base is not None:
            self.base_image.setLevels(top.levels)
        return top, self.window or self.base
