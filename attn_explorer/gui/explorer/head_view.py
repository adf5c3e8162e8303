"""The head page: one head's N×N attention, large, with token labels on both axes.

Hovering a cell shows `query "it" → key "animal": 0.43`; a new result clears that line, since it
described the old map. The layer and head come from the session (spin boxes in the window's toolbar,
arrow keys); the colormap, linear/log scale and "hide special tokens" too. Long inputs stay legible:
the axes label as many tokens as fit, and the mouse wheel zooms in (drag pans) until every token has
its label.

A long input (session.long_view.windowed: a lazy run, whose maps were never kept) is never drawn from a
whole map: the worker lanes pool it to the view's pixels, and every zoom or pan asks again for the visible
window, at full resolution once it fits (newest ask wins; an answer for another run, head or window is
dropped). Under the map, the selected query's row spans every key (gui/explorer/query_strip.py); "Go to
token" jumps to a number or a word; the colour scale is the weights, each row scaled to its max, or a
percentile clip with sink columns left apart (session.long_view.colour_scale), and a label says which.
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QLineEdit, QSizePolicy, QWidget
from superqt import QElidingLabel

from attn_explorer.gui.widgets.heatmap import (CanvasStack, LazyPage, PaintedGraphicsWidget, TokenAxis, add_heat_image,
                                       cell_under, colormap, follow_loading, set_bar_label, style_colorbar)
from attn_explorer.gui.explorer.controls import StackSwitch, titled_page
from attn_explorer.gui.explorer.query_strip import QueryStrip
from attn_explorer.errors import UserError
from attn_explorer.maths import hidden_tokens, kept_tokens, renormalise_without, without_specials
from attn_explorer.session.long_view import (COLOUR_NAMES, COLOUR_SCALES, STRIP_LANE, WINDOW_LANE, Window, WindowAsk,
                                             colour_scale, find_token, result_tag, strip_job, strip_of_row,
                                             visible_ask, window_job, windowed)
from attn_explorer.session.stacks import STACK_NAMES, StackMaps
from attn_explorer.session.state import SessionState

def common_prefix(a: list[str], b: list[str]) -> int:
    """How many leading tokens a and b share (an edit at the end keeps all but the last few)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class HoverLine(QElidingLabel):
    """The hover read-out: one line elided to the room there is, its whole text in the tooltip. It never asks
    for more width (at 1024 px a long input's line widened the window and cut off the colour bar)."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.setMinimumWidth(0)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        super().setText(text)
        self.setToolTip(text)


HOVER_HINT = "Hover over the map: query → key: weight. Wheel zooms, drag pans."


def head_matrix(r, layer: int, head: int, hide_special: bool) -> tuple[np.ndarray, list[str]]:
    """The (n, n) map to draw and its token labels; with hide_special, specials dropped and rows renormalised."""
    m = r.attentions[layer, head]
    if not hide_special:
        return m, list(r.tokens)
    return without_specials(m, r.special), [r.tokens[i] for i in kept_tokens(r.special, len(r.tokens))]


def stack_matrix(m: StackMaps, layer: int, head: int, hide_special: bool
                 ) -> tuple[np.ndarray, list[str], list[str], np.ndarray]:
    """One head of a stack (rows = queries, columns = keys; cross-attention: target × source): the map to
    draw, its row and column labels, and the row indices shown. With hide_special, specials dropped on
    both axes and rows renormalised."""
    a = m.attentions[layer, head]
    R, C = a.shape
    if not hide_special:
        return a, list(m.rows), list(m.cols), np.arange(R)
    if m.square:
        keep = kept_tokens(m.row_special, R)
        return without_specials(a, m.row_special), [m.rows[i] for i in keep], [m.cols[j] for j in keep], keep
    keep_r, keep_c = kept_tokens(m.row_special, R), kept_tokens(m.col_special, C)
    cols = hidden_tokens(m.col_special)
    a = a[keep_r] if cols is None else renormalise_without(a[keep_r], cols)
    return a, [m.rows[i] for i in keep_r], [m.cols[j] for j in keep_c], keep_r


AXIS_TITLES = {"encoder": ("query (row)", "key (column)"),
               "decoder": ("target token (query, row)", "target token (key, column)"),
               "cross": ("target token (query, row)", "source token (key, column)")}


def shown_count(r, n: int) -> str:
    """What an n×n map of result r shows, in words that agree with the token count elsewhere: "16×16 (all 16
    tokens)", or "256×256: 256 of 257 tokens, 1 special hidden, rows renormalised"."""
    total = r.num_tokens
    if n == total:
        return f"{n}×{n} (all {total} tokens)"
    return f"{n}×{n}: {n} of {total} tokens, {total - n} special hidden, rows renormalised"


GOTO_SPAN = 48  # most tokens on each axis after "Go to token" (fewer when the axis has no room to name them all)
ASK_DELAY_MS = 40  # zoom and pan settle this long before the window is asked for again
BASE_LANE = WINDOW_LANE + ":whole"  # the whole map pooled to the screen, under the window


class HeadView(LazyPage, QWidget):
    """One large heatmap of the selected head, with the selected query's row as a strip over every key.

    A short input's map is drawn whole from the run. A long one (session.long_view.windowed) is never held:
    the view asks the window lane for the whole map pooled to its pixels, and after each wheel zoom or
    drag pan for the visible rows × columns, at full resolution once they fit the pixels (newest ask
    wins; an answer for another run, head or window is dropped). Single click picks the query; double click
    asks to look inside the head for it (`inside_requested(token index)`; the window opens "Inside a head")."""

    inside_requested = Signal(int)

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.title = QLabel("")
        self.title.setWordWrap(True)  # a long header (stack, layer kind, counts) wraps instead of widening the window
        self.readout = HoverLine(HOVER_HINT)
        self.readout.setStyleSheet("font-family: monospace;")
        self.canvas = PaintedGraphicsWidget()
        self.stack = CanvasStack(self.canvas)
        self.placeholder = self.stack.placeholder
        self.left_axis = TokenAxis("left")
        self.bottom_axis = TokenAxis("bottom", rotate=True)
        self.plot = self.canvas.addPlot(axisItems={"left": self.left_axis, "bottom": self.bottom_axis})
        self.plot.invertY(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setLabel("left", "query (row)")
        self.plot.setLabel("bottom", "key (column)")
        self.plot.getViewBox().setAspectLocked(False)
        self.base_image = pg.ImageItem(axisOrder="row-major")  # long inputs: the whole map, pooled
        self.plot.addItem(self.base_image)
        self.image, self.colorbar = add_heat_image(self.plot, state.colormap)
        self.colorbar.axis.enableAutoSIPrefix(False)  # a clipped scale reads 0.02, not "20 (x0.001)"
        self.colorbar.axis.setWidth(None)  # wide enough for "0.005" and the title beside it
        self.query_mark = pg.PlotCurveItem(pen=pg.mkPen("#ff3b30", width=1))
        self.plot.addItem(self.query_mark)
        self.matrix: np.ndarray | None = None  # short inputs: the map drawn (None for a long one)
        self.tokens: list[str] = []  # the rows' labels (the queries)
        self.col_tokens: list[str] = []  # the columns' labels (the keys)
        self.shown_rows: np.ndarray = np.arange(0)  # row i of the map is the stack's row shown_rows[i]
        self.stack_shown = "encoder"
        self.long = False  # the map on screen is drawn windowed (a long input)
        self.window: Window | None = None  # long inputs: the visible window's answer drawn over the base
        self.base: Window | None = None  # long inputs: the whole map pooled to the screen
        self._asked: WindowAsk | None = None  # the newest window asked for (drawn or on its way)
        self._base_asked: WindowAsk | None = None  # the newest whole map asked for
        self._head: tuple | None = None  # (run tag, layer, head) of what the images show
        self.scale_info = ""  # the colour scale's description, as the label shows it

        self.goto = QLineEdit()
        self.goto.setPlaceholderText("Go to token (number or word)")
        self.goto.setToolTip("Type a token's number or a word and press Enter (Ctrl+G comes here): it becomes the "
                             "query and the map moves to it (a word: its next occurrence after the query)")
        self.goto.setMinimumWidth(200)
        self.goto.setMaximumWidth(240)
        self.goto_note = QLabel("")
        self._goto_at: int | None = None  # the token the "Go to" line names (None: it names none)
        self._goto_text = ""  # what the box said when it went there
        self.scale_combo = QComboBox()
        for key in COLOUR_SCALES:
            self.scale_combo.addItem(COLOUR_NAMES[key], key)
        self.scale_combo.setToolTip("Colour: the weights themselves (comparable across heads); each row scaled to "
                                    "its own max (a row that spreads its weight reads as well as one that gives it "
                                    "to a sink); or 0 to the 99th percentile with sink columns left blank")
        self.scale_label = QLabel("")
        self.scale_label.setWordWrap(True)
        self.strip = QueryStrip()

        self.stack_switch = StackSwitch(state)
        lay = titled_page(self, self.title, self.stack_switch)
        tools = QHBoxLayout()
        tools.addWidget(self.goto)
        tools.addWidget(self.goto_note, 1)
        tools.addWidget(QLabel("Colour:"))
        tools.addWidget(self.scale_combo)
        lay.addLayout(tools)
        lay.addWidget(self.stack, 1)
        lay.addWidget(self.strip)
        lay.addWidget(self.scale_label)
        lay.addWidget(self.readout)

        self._ask_timer = QTimer(self)
        self._ask_timer.setSingleShot(True)
        self._ask_timer.setInterval(ASK_DELAY_MS)
        self._ask_timer.timeout.connect(self._ask_window)
        self.plot.vb.sigRangeChanged.connect(self._range_moved)
        self.plot.vb.sigResized.connect(self._range_moved)
        self.goto.returnPressed.connect(lambda: self.go_to(self.goto.text()))
        find = QShortcut(QKeySequence("Ctrl+G"), self)  # on this page: type where to go
        find.setContext(Qt.WidgetWithChildrenShortcut)
        find.activated.connect(lambda: (self.goto.setFocus(), self.goto.selectAll()))
        self.scale_combo.activated.connect(lambda i: state.set_options(colour_scale=self.scale_combo.itemData(i)))
        self.strip.key_clicked.connect(self._key_clicked)
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        state.attention_ready.connect(self.refresh)
        state.selection_changed.connect(lambda *_: self.refresh())
        state.query_changed.connect(lambda *_: self._query_moved())
        state.options_changed.connect(self._options)
        state.model_loading.connect(lambda *_: self.readout.setText(HOVER_HINT))
        state.input_cleared.connect(self._cleared)
        follow_loading(state, self.stack.show_message)

    # --------------------------------------------------------------------------------- drawing
    def refresh(self, *_):
        self.readout.setText(HOVER_HINT)  # it described the map being replaced
        r = self.result_to_draw()
        if r is None:
            return
        self.stack.show_canvas()
        st = self.state
        m = st.maps(r)
        L, H = m.attentions.shape[:2]
        l, h = min(st.layer, L - 1), min(st.head, H - 1)
        if m.stack != self.stack_shown:
            self.stack_shown = m.stack
            left, bottom = AXIS_TITLES[m.stack]
            self.plot.setLabel("left", left)
            self.plot.setLabel("bottom", bottom)
            self.tokens = []  # lay the axes out again for the other stack's tokens
        long = windowed(r, m.stack)
        if long != self.long:
            self.long = long
            self.tokens = []
            for axis in (self.left_axis, self.bottom_axis):
                axis.numbers_when_crowded = long
        if long:
            self._draw_long(r, m, l, h)
        else:
            self._draw_dense(m, l, h)
        self._mark_query()
        self._describe(r, m, l, h)
        self._refresh_strip()

    def _set_axes(self, rows: list[str], cols: list[str]) -> bool:
        """Label the axes with these tokens; False when they were already these. A zoomed view of an edited
        input (the tokens before the window unchanged) keeps its window, clamped to the new length, and the
        "Go to" line while its token is unchanged; any other new input is shown whole."""
        if rows == self.tokens and cols == self.col_tokens:
            return False
        (x0, x1), (y0, y1) = self.plot.vb.viewRange()
        old_r, old_c = len(self.tokens), len(self.col_tokens)
        zoomed = old_r > 0 and (y1 - y0 < old_r - 0.5 or x1 - x0 < old_c - 0.5)
        same_r, same_c = common_prefix(self.tokens, rows), common_prefix(self.col_tokens, cols)
        keep = zoomed and same_r >= max(2, int(y0)) and same_c >= max(2, int(x0))
        self.tokens, self.col_tokens = rows, cols
        if not (keep and self._goto_at is not None and self._goto_at < same_r):
            self._forget_goto()  # it named a token of the old input
        self.left_axis.set_labels(rows)
        self.bottom_axis.set_labels(cols)
        R, C = len(rows), len(cols)
        vb = self.plot.getViewBox()
        vb.setLimits(xMin=0, xMax=C, yMin=0, yMax=R, minXRange=min(C, 4), minYRange=min(R, 4))
        if keep:
            h, w = min(y1 - y0, R), min(x1 - x0, C)
            y0, x0 = max(0.0, min(y0, R - h)), max(0.0, min(x0, C - w))
            self.plot.setRange(xRange=(x0, x0 + w), yRange=(y0, y0 + h), padding=0)
        else:
            self.plot.setRange(xRange=(0, C), yRange=(0, R), padding=0)
        return True

    def _forget_goto(self) -> None:
        """The "Go to" line names no token any more: the box loses what it went to (what the user is typing
        there stays), so that box and line never disagree."""
        if self._goto_at is not None and self.goto.text() == self._goto_text:
            self.goto.clear()
        self._goto_at, self._goto_text = None, ""
        self.goto_note.setText("")

    def _draw_dense(self, m: StackMaps, l: int, h: int) -> None:
        """A short input: the whole map from the run, as it is."""
        st = self.state
        self.window = self.base = self._asked = None
        self.base_image.clear()
        self.matrix, rows, cols, self.shown_rows = stack_matrix(m, l, h, st.hide_special)
        self._head = (result_tag(st.result), l, h)
        self._set_axes(rows, cols)
        self._paint()

    def _draw_long(self, r, m: StackMaps, l: int, h: int) -> None:
        """A long input: ask for the whole map pooled to the screen and for the visible window."""
        self.matrix = None
        self.shown_rows = np.arange(len(m.rows))
        new_tokens = self._set_axes(list(m.rows), list(m.cols))
        head = (result_tag(r), l, h)
        if head != self._head or new_tokens:
            self._head = head
            self.window = self.base = self._asked = None
            self.image.clear()
            self.base_image.clear()
            self.state.cancel(WINDOW_LANE)
            self._ask_base(r, l, h)
        self._paint()
        self._ask_timer.start()

    def _pixels(self) -> tuple[int, int]:
        vb = self.plot.vb
        return max(16, int(vb.height())), max(16, int(vb.width()))

    def _ask_base(self, r, l: int, h: int) -> None:
        n = r.num_tokens
        ask = self._base_asked = visible_ask(r, l, h, (0, n), (0, n), self._pixels())
        self.state.submit(window_job, r, ask, key=BASE_LANE, uses_model=False,
                          on_result=lambda win: self._window_arrived(win, base=True))

    def _range_moved(self, *_) -> None:
        """A zoom, pan or resize: the hover line described another cell, and a long map asks again."""
        self.readout.setText(HOVER_HINT)
        vr = self.plot.vb.viewRange()
        self.strip.mark_window(*vr[0])
        if self.long:
            self._ask_timer.start()

    def visible_ask(self) -> WindowAsk | None:
        """The window the view shows now, as it would ask for it (None: no long map on screen)."""
        r = self.state.result
        if not self.long or r is None or self._head is None or self._head[0] != result_tag(r):
            return None
        (x0, x1), (y0, y1) = self.plot.vb.viewRange()
        return visible_ask(r, self._head[1], self._head[2], (x0, x1), (y0, y1), self._pixels())

    def _ask_window(self) -> None:
        ask = self.visible_ask()
        if ask is None:
            return
        n = self.state.result.num_tokens
        if ask.rows == (0, n) and ask.cols == (0, n):  # the whole map: the base shows it
            base = self.base.ask if self.base is not None else self._base_asked
            if base is None or base.cells != ask.cells:  # the view was resized: pool to its pixels again
                self._ask_base(self.state.result, ask.layer, ask.head)
            self.state.cancel(WINDOW_LANE)
            self._asked = None
            if self.window is not None:
                self.window = None
                self.image.clear()
                self._paint()
            return
        if ask == self._asked:
            return
        self._asked = ask
        self.state.submit(window_job, self.state.result, ask, key=WINDOW_LANE, uses_model=False,
                          on_result=lambda win: self._window_arrived(win))

    def _window_arrived(self, win: Window, base: bool = False) -> None:
        """An answer of the window lane: drawn only if it is for the run, head and window shown now."""
        r = self.state.result
        if r is None or not self.long or (win.ask.tag, win.ask.layer, win.ask.head) != self._head:
            return  # another run or head: dropped
        if win.ask.tag != result_tag(r):
            return
        if base:
            if win.ask != self._base_asked:
                return  # pooled for another size of the view: its newer ask is on the way
            self.base = win
        elif win.ask == self._asked:
            self.window = win
        else:
            return  # the view moved on since it was asked
        self._paint()

    def _paint(self) -> None:
        """Colour what is at hand (the dense map, or the base and the window) by the session's colour scale."""
        st = self.state
        mode, log = st.colour_scale, st.log_scale
        if self.matrix is not None:
            top = colour_scale(self.matrix, mode, log)
            self.image.setImage(top.values, levels=top.levels, autoLevels=False)
            R, C = self.matrix.shape
            self.image.setRect(QRectF(0, 0, C, R))
            self._scale_shown(top, self.matrix.shape[1])
            return
        top = None
        for win, item in ((self.base, self.base_image), (self.window, self.image)):
            if win is None:
                continue
            scaled = colour_scale(win.values, mode, log)
            top = scaled
            item.setLookupTable(colormap(st.colormap).getLookupTable(0.0, 1.0, 256))
            item.setImage(scaled.values, levels=scaled.levels, autoLevels=False)
            a, b = win.ask.rows
            c, d = win.ask.cols
            item.setRect(QRectF(c, a, d - c, b - a))
        if self.window is None:
            self.image.clear()
        if top is not None:
            if self.window is not None and self.base is not None:  # one colour bar: the window's levels for both
                self.base_image.setLevels(top.levels)
            self._scale_shown(top, None, self.window or self.base)
        else:
            self.scale_label.setText("Computing the map from q and k…")

    def _scale_shown(self, scaled, cols: int | None, win: Window | None = None) -> None:
        """The colour bar's levels and title, and the label that says which colour scale is on."""
        self.colorbar.setLevels(values=scaled.levels)
        set_bar_label(self.colorbar, scaled.label)
        text = f"Colour: <b>{html.escape(scaled.label, quote=False)}</b>"
        if scaled.sinks.size:
            if win is not None:
                keys = [f"{win.col_edges[j]:,}" + (f"–{win.col_edges[j + 1] - 1:,}"
                                                   if win.col_edges[j + 1] - win.col_edges[j] > 1 else "")
                        for j in scaled.sinks[:4]]
            else:
                keys = [f"{j:,}" for j in scaled.sinks[:4]]
                names = [self.col_tokens[j] for j in scaled.sinks[:4] if j < len(self.col_tokens)]
                keys = [f'{k} "{html.escape(t)}"' for k, t in zip(keys, names)]
            text += (f" — sink key{'s' if len(keys) > 1 else ''} {', '.join(keys)} left blank: "
                     f"{scaled.sink_share:.0%} of these rows' weight on average")
        if self.long and self.state.hide_special:
            text += " — <i>Hide special tokens applies to inputs up to the windowed length only</i>"
        self.scale_info = text
        self.scale_label.setText(text)

    def _mark_query(self) -> None:
        """Outline the query's row (where it is shown)."""
        r = self.state.result
        if r is None:
            self.query_mark.setData([], [])
            return
        q = self.state.query
        at = np.flatnonzero(self.shown_rows == q)
        C = len(self.col_tokens)
        if not at.size or not C:
            self.query_mark.setData([], [])
            return
        i = float(at[0])
        self.query_mark.setData(np.array([0, C, C, 0, 0], float), np.array([i, i, i + 1, i + 1, i], float))

    def _query_moved(self) -> None:
        self._mark_query()
        self._refresh_strip()

    # --------------------------------------------------------------------------------- the strip
    def _refresh_strip(self) -> None:
        """The selected query's row over every key: from the dense map at hand, or asked of the strip lane."""
        st = self.state
        r = st.result
        if r is None or self._head is None or not self.isVisible():
            return
        _, l, h = self._head
        q = st.query
        m = st.maps(r)
        if self.matrix is not None:
            at = np.flatnonzero(self.shown_rows == q)
            if not at.size:
                self.strip.clear(f"The query, token {q}, is hidden (a special token).")
                return
            strip = strip_of_row(self.matrix[int(at[0])], self.strip.width_px(), result_tag(r), l, h, q)
            self.strip.show_strip(strip, self.col_tokens, st.colormap, st.colour_scale, st.log_scale)
            self.strip.mark_window(*self.plot.vb.viewRange()[0])
            return
        self.strip.clear(f"Strip: computing query {q:,}'s row over all {r.num_tokens:,} keys…")
        want = (result_tag(r), l, h, q)
        self.state.submit(strip_job, r, l, h, q, self.strip.width_px(), key=STRIP_LANE, uses_model=False,
                          on_result=lambda s: self._strip_arrived(s, want, m.cols))

    def _strip_arrived(self, strip, want: tuple, tokens: list[str]) -> None:
        st = self.state
        r = st.result
        now = (result_tag(r), *self._head[1:], st.query) if r is not None and self._head is not None else None
        if now != want or (strip.tag, strip.layer, strip.head, strip.query) != want:
            return  # another run, head or query since: its own strip is on its way
        self.strip.show_strip(strip, tokens, st.colormap, st.colour_scale, st.log_scale)
        self.strip.mark_window(*self.plot.vb.viewRange()[0])

    def _key_clicked(self, j: int) -> None:
        """The strip was clicked at key j: show those keys (the same width of view, centred there)."""
        (x0, x1), _ = self.plot.vb.viewRange()
        span = x1 - x0
        C = len(self.col_tokens)
        lo = min(max(0.0, j + 0.5 - span / 2), max(0.0, C - span))
        self.plot.setXRange(lo, lo + span, padding=0)

    # --------------------------------------------------------------------------------- go to token
    def go_to(self, text: str) -> int | None:
        """The "Go to token" box: make the token it names the query and centre the map on it."""
        st = self.state
        m = st.maps()
        if m is None:
            return None
        try:
            i = find_token(list(m.rows), text, after=st.query)
        except UserError as e:
            self.goto_note.setText(f'<span style="color:#b00020">{html.escape(str(e), quote=False)}</span>')
            return None
        st.set_query(i)
        at = np.flatnonzero(self.shown_rows == i)
        pos = int(at[0]) if at.size else int(np.searchsorted(self.shown_rows, i))
        R, C = len(self.tokens), len(self.col_tokens)
        rows = min(GOTO_SPAN, R, self.left_axis.tokens_that_fit())  # a label each
        cols = min(GOTO_SPAN, C, self.bottom_axis.tokens_that_fit())
        y0 = min(max(0, pos - rows // 2), max(0, R - rows))
        x0 = min(max(0, pos - cols // 2), max(0, C - cols))
        self.plot.setRange(xRange=(x0, x0 + cols), yRange=(y0, y0 + rows), padding=0)
        self.goto_note.setText(f'token {i:,} "{html.escape(m.rows[i])}"')
        self._goto_at, self._goto_text = i, self.goto.text()
        return i

    # --------------------------------------------------------------------------------- header
    def _describe(self, r, m: StackMaps, l: int, h: int) -> None:
        st = self.state
        info = st.info
        tag = "" if info is None or info.trained else "  (untrained model: random weights)"
        kinds = st.layer_kinds()
        kind = f" ({html.escape(kinds[l])})" if l < len(kinds) else ""
        R, C = len(self.tokens), len(self.col_tokens)
        if m.stack == "encoder":
            causal = " — causal: no weight above the diagonal" if info is not None and info.causal else ""
            count = shown_count(r, R)
            if self.long:
                how = "computed from q and k" if getattr(r, "is_lazy", False) else "from the run"
                count = (f"{R:,}×{R:,} (all {R:,} tokens; {how}, pooled to the screen: the wheel zooms in "
                         "until every cell is one weight)")
        elif m.stack == "decoder":
            causal = " — causal: no weight above the diagonal"
            count = f"{R}×{C} target tokens" + (" (special hidden, rows renormalised)" if R < len(m.rows) else "")
        else:
            causal = ""
            count = (f"{R} target × {C} source tokens"
                     + (" (special hidden, rows renormalised)" if (R, C) != (len(m.rows), len(m.cols)) else ""))
        what = f"{STACK_NAMES[m.stack]}: " if r.decoder_attentions is not None else ""
        self.title.setText(f"{html.escape(what)}<b>Layer {l}{kind}, head {h}</b> — {count}, "
                           f"dk scale {r.dk_scale:.2f}×{causal}{tag}")

    def _options(self):
        style_colorbar(self.colorbar, self.state.colormap, self.state.log_scale)
        i = self.scale_combo.findData(self.state.colour_scale)
        if i >= 0 and i != self.scale_combo.currentIndex():
            self.scale_combo.setCurrentIndex(i)
        self.refresh()

    def _cleared(self) -> None:
        """The input was emptied: the strip, read-outs and any window on its way go with the map."""
        for lane in (WINDOW_LANE, BASE_LANE, STRIP_LANE):
            self.state.cancel(lane)
        self.window = self.base = self._asked = None
        self._head = None
        self.strip.clear()
        self._forget_goto()
        self.readout.setText(HOVER_HINT)

    # --------------------------------------------------------------------------------- pointer
    def describe(self, i: int, j: int) -> str:
        """`query "it" → key "animal": 0.43` for row i, column j (of the dense map drawn)."""
        return f'query "{self.tokens[i]}" → key "{self.col_tokens[j]}": {self.matrix[i, j]:.2f}'

    def describe_long(self, i: int, j: int) -> str | None:
        """What the pointer is over in a long map: one weight at full resolution, else the pooled cell."""
        for win in (self.window, self.base):
            if win is None or not (win.ask.rows[0] <= i < win.ask.rows[1] and win.ask.cols[0] <= j < win.ask.cols[1]):
                continue
            a = int(np.searchsorted(win.row_edges, i, side="right") - 1)
            b = int(np.searchsorted(win.col_edges, j, side="right") - 1)
            v = float(win.values[a, b])
            r0, r1, c0, c1 = win.row_edges[a], win.row_edges[a + 1], win.col_edges[b], win.col_edges[b + 1]
            if r1 - r0 == 1 and c1 - c0 == 1:
                return f'query "{self.tokens[i]}" ({i:,}) → key "{self.col_tokens[j]}" ({j:,}): {v:.3f}'
            return (f"queries {r0:,}–{r1 - 1:,} → keys {c0:,}–{c1 - 1:,}: largest weight {v:.3f} "
                    "(pooled: zoom in for each weight)")
        return None

    def _clicked(self, ev) -> None:
        r = self.state.result
        if r is None or not self.tokens or not self.plot.vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        i = int(np.floor(self.plot.vb.mapSceneToView(ev.scenePos()).y()))
        shown = self.shown_rows  # row i: the i-th shown
        if 0 <= i < len(shown):
            self.state.set_query(int(shown[i]))
            if ev.double() and self.stack_shown == "encoder":  # "Inside a head" opens the encoder's heads
                self.inside_requested.emit(int(shown[i]))

    def _hovered(self, scene_pos):
        if not self.tokens:
            return
        if self.matrix is not None:
            hit = cell_under(self.plot, scene_pos, self.matrix.shape)
            if hit is not None:
                self.readout.setText(self.describe(*hit))
            return
        hit = cell_under(self.plot, scene_pos, (len(self.tokens), len(self.col_tokens)))
        if hit is not None:
            text = self.describe_long(*hit)
            self.readout.setText(text if text is not None else "computing this part of the map…")
