"""The head page: one head's N×N attention, large, with token labels on both axes.

Hovering a cell shows `query "it" → key "animal": 0.43`; a new result clears that line, since it described the
old map. The layer and head come from the session (spin boxes in the window's toolbar, arrow keys); the colormap,
linear/log scale and "hide special tokens" too. Long inputs stay legible: the axes label as many tokens as fit,
and the mouse wheel zooms in (drag pans) until every token has its label.

Its parts, each in its own module of gui/explorer: the map drawn and the title's counts (head_maps.py); a long
input's map, never drawn whole but asked of the worker lanes pooled to the view's pixels and again for the
visible window after every zoom or pan, and the header's mark while a new input runs (long_map.py); the query's
row over every key (query_strip.py); "Go to token" (goto_box.py); the colour scale (weights, each row scaled to
its max, or a percentile clip with sinks apart) and its label (colour_key.py); the hover line (hover.py).
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from attn_explorer.gui.widgets.heatmap import (CanvasStack, LazyPage, PaintedGraphicsWidget, colormap, add_heat_image,
                                       cell_under, follow_loading, set_bar_label, style_colorbar)
from attn_explorer.gui.explorer.colour_key import ColourScaleBox, scale_text
from attn_explorer.gui.explorer.mixer_marks import diverging_colormap
from attn_explorer.session import mixers as mx
from attn_explorer.gui.explorer.controls import StackSwitch, titled_page
from attn_explorer.gui.explorer.goto_box import GoToBox, view_around
from attn_explorer.gui.explorer.head_maps import AXIS_TITLES, common_prefix, shown_count, stack_matrix, with_sink
from attn_explorer.gui.explorer.head_maps import head_matrix  # noqa: F401 - tests/gui/test_readable.py imports it here
from attn_explorer.gui.explorer.image_bands import BandedAxis, ImageBands  # issue 26 B: image blocks as bands
from attn_explorer.gui.explorer.hover import HOVER_HINT, HoverLine, cell_text, window_cell_text
from attn_explorer.gui.explorer.long_map import LongMap, marked
from attn_explorer.gui.explorer.query_strip import QueryStrip
from attn_explorer.gui.explorer.sink_column import SinkColumn
from attn_explorer.errors import UserError
from attn_explorer.session.long_view import (STRIP_LANE, Scaled, Window, colour_scale, find_token, result_tag,
                                             sink_text, strip_job, strip_of_row, windowed)
from attn_explorer.session.stacks import STACK_NAMES, StackMaps
from attn_explorer.session.state import SessionState


class HeadView(LazyPage, QWidget):
    """One large heatmap of the selected head, with the selected query's row as a strip over every key.

    A short input's map is drawn whole from the run. A long one (session.long_view.windowed) is never held:
    `long_map` asks the window lane for the whole map pooled to the view's pixels, and after each wheel zoom
    or drag pan for the visible rows × columns, at full resolution once they fit the pixels (newest ask
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
        self.left_axis = BandedAxis("left")
        self.bottom_axis = BandedAxis("bottom", rotate=True)
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
        self.sink = SinkColumn(self.plot, self.bottom_axis)  # gpt-oss: the learned sink's share, left of key 0
        self.query_mark = pg.PlotCurveItem(pen=pg.mkPen("#ff3b30", width=1))
        self.plot.addItem(self.query_mark)
        self.long_map = LongMap(state, self.plot, self.base_image, self.image, self)
        self.matrix: np.ndarray | None = None  # short inputs: the map drawn (None for a long one)
        self.tokens: list[str] = []  # the rows' labels (the queries)
        self.col_tokens: list[str] = []  # the columns' labels (the keys)
        self.shown_rows: np.ndarray = np.arange(0)  # row i of the map is the stack's row shown_rows[i]
        self.stack_shown = "encoder"
        self.long = False  # the map on screen is drawn windowed (a long input)
        self._head: tuple | None = None  # (run tag, layer, head) of what the images show
        self.scale_info = ""  # the colour scale's description, as the label shows it

        self.goto_box = GoToBox()
        self.goto, self.goto_note = self.goto_box.edit, self.goto_box.note
        self.scale_combo = ColourScaleBox()
        self.scale_label = QLabel("")
        self.scale_label.setWordWrap(True)
        self.strip = QueryStrip()

        self.stack_switch = StackSwitch(state)
        lay = titled_page(self, self.title, self.stack_switch)
        tools = QHBoxLayout()
        tools.addWidget(self.goto_box, 1)
        tools.addWidget(QLabel("Colour:"))
        tools.addWidget(self.scale_combo)
        lay.addLayout(tools)
        lay.addWidget(self.stack, 1)
        lay.addWidget(self.strip)
        lay.addWidget(self.scale_label)
        lay.addWidget(self.readout)

        self.long_map.changed.connect(self._paint)
        self.plot.vb.sigRangeChanged.connect(self._range_moved)
        self.plot.vb.sigResized.connect(self._range_moved)
        self.goto.returnPressed.connect(lambda: self.go_to(self.goto.text()))
        find = QShortcut(QKeySequence("Ctrl+G"), self)  # on this page: type where to go
        find.setContext(Qt.WidgetWithChildrenShortcut)
        find.activated.connect(self.goto_box.focus)
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
        for sig in (state.busy_changed, state.run_progressed):  # the map is the previous input's while a run goes
            sig.connect(lambda *_: self.title.setText(marked(state, self.title.text())))
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
        lead = self.sink.width  # gpt-oss's sink column takes x in [-1, 0)
        if rows == self.tokens and cols == self.col_tokens and lead == getattr(self, "_lead", 0):
            return False
        self._lead = lead
        (x0, x1), (y0, y1) = self.plot.vb.viewRange()
        old_r, old_c = len(self.tokens), len(self.col_tokens)
        zoomed = old_r > 0 and (y1 - y0 < old_r - 0.5 or x1 - x0 < old_c - 0.5)
        same_r, same_c = common_prefix(self.tokens, rows), common_prefix(self.col_tokens, cols)
        keep = zoomed and same_r >= max(2, int(y0)) and same_c >= max(2, int(x0))
        self.tokens, self.col_tokens = rows, cols
        if not (keep and self.goto_box.at is not None and self.goto_box.at < same_r):
            self.goto_box.forget()  # it named a token of the old input
        self.left_axis.set_labels(rows)
        self.bottom_axis.set_labels(cols)
        ImageBands.on(self).show(self)
        R, C = len(rows), len(cols)
        vb = self.plot.getViewBox()
        vb.setLimits(xMin=-lead, xMax=C, yMin=0, yMax=R, minXRange=min(C, 4), minYRange=min(R, 4))
        if keep:
            h, w = min(y1 - y0, R), min(x1 - x0, C)
            y0, x0 = max(0.0, min(y0, R - h)), max(0.0, min(x0, C - w))
            self.plot.setRange(xRange=(x0, x0 + w), yRange=(y0, y0 + h), padding=0)
        else:
            self.plot.setRange(xRange=(-lead, C), yRange=(0, R), padding=0)
        return True

    def _draw_dense(self, m: StackMaps, l: int, h: int) -> None:
        """A short input: the whole map from the run, as it is."""
        st = self.state
        self.long_map.forget()
        self.base_image.clear()
        self.matrix, rows, cols, self.shown_rows = stack_matrix(m, l, h, st.hide_special)
        self.matrix, sink = with_sink(m, getattr(st.result, "sinks", None), l, h, st.hide_special, self.matrix,
                                      self.shown_rows)
        self.sink.set(sink)
        self._head = (result_tag(st.result), l, h)
        if m.stack == "encoder" and not mx.head_exists(st.info, l, h):  # a padded head: blank, not zeros
            self.matrix = mx.absent_map(self.matrix.shape)
        elif m.stack == "encoder" and st.hide_special and mx.is_recurrent(st.info, l):  # signed: no renormalising
            self.matrix = mx.signed_without_specials(m.attentions[l, h], m.row_special)
        self._set_axes(rows, cols)
        self._paint()

    def _draw_long(self, r, m: StackMaps, l: int, h: int) -> None:
        """A long input: ask for the whole map pooled to the screen and for the visible window."""
        self.matrix = None
        self.shown_rows = np.arange(len(m.rows))
        if m.stack == "encoder" and not mx.head_exists(self.state.info, l, h):  # a padded head: nothing to ask for
            self.long_map.forget()
            for item in (self.image, self.base_image):
                item.clear()
            self._head = (result_tag(r), l, h)
            self._set_axes(list(m.rows), list(m.cols))
            self.scale_label.setText(f"<b>{mx.ABSENT}</b>: drawn blank.")
            return
        sinks = getattr(r, "sinks", None)
        self.sink.set(sinks[l, h] if sinks is not None and m.stack == "encoder" else None)
        new_tokens = self._set_axes(list(m.rows), list(m.cols))
        self.long_map.show(r, l, h, new_tokens)
        self._head = self.long_map.head
        self._paint()
        self.long_map.ask_soon()

    def _range_moved(self, *_) -> None:
        """A zoom, pan or resize: the hover line described another cell, and a long map asks again."""
        self.readout.setText(HOVER_HINT)
        vr = self.plot.vb.viewRange()
        self.strip.mark_window(*vr[0])
        if self.long:
            self.long_map.ask_soon()

    def _paint(self) -> None:
        """Colour what is at hand (the dense map, or the base and the window) by the session's colour scale."""
        st = self.state
        mode, log = st.colour_scale, st.log_scale
        if self.matrix is not None:
            signed = self.signed_label()  # a recurrent layer's implicit map: diverging, centred at 0 (issue 25)
            self.colorbar.setColorMap(diverging_colormap() if signed else colormap(st.colormap))
            top = (mx.signed_scaled(self.matrix, signed) if signed else
                   self.sink.paint(self.matrix, mode, log, st.colormap) or colour_scale(self.matrix, mode, log))
            self.image.setImage(top.values, levels=top.levels, autoLevels=False)
            R, C = self.matrix.shape
            self.image.setRect(QRectF(0, 0, C, R))
            self._scale_shown(top)
            return
        signed = self.signed_label()
        self.colorbar.setColorMap(diverging_colormap() if signed else colormap(st.colormap))
        painted = self.long_map.paint(mode, log, st.colormap, signed)
        if painted is not None:
            self.sink.paint(None, mode, log, st.colormap, levels=painted[0].levels)
            self._scale_shown(*painted)
        else:
            self.scale_label.setText("Computing the map from q and k…")

    def signed_label(self) -> str:
        """"implicit attention (Gated DeltaNet)" while a recurrent layer's head is drawn, else ""."""
        if self._head is None or self.stack_shown != "encoder":
            return ""
        return mx.mixer_label(self.state.info, self._head[1])

    def _scale_shown(self, scaled: Scaled, win: Window | None = None) -> None:
        """The colour bar's levels and title, and the label that says which colour scale is on."""
        self.colorbar.setLevels(values=scaled.levels)
        set_bar_label(self.colorbar, scaled.label)
        self.scale_info = scale_text(scaled, win, self.col_tokens, self.long and self.state.hide_special)
        self.scale_label.setText(self.scale_info)

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
        x0 = -self.sink.width
        self.query_mark.setData(np.array([x0, C, C, x0, x0], float), np.array([i, i, i + 1, i + 1, i], float))

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
        if m.stack == "encoder" and not mx.head_exists(st.info, l, h):
            return self.strip.clear(f"{mx.ABSENT}.")
        if self.matrix is not None:
            at = np.flatnonzero(self.shown_rows == q)
            if not at.size:
                self.strip.clear(f"The query, token {q}, is hidden (a special token).")
                return
            make = mx.signed_strip if self.signed_label() else strip_of_row  # by |A| on a recurrent layer
            strip = make(self.matrix[int(at[0])], self.strip.width_px(), result_tag(r), l, h, q)
            self.strip.show_strip(strip, self.col_tokens, st.colormap, st.colour_scale, st.log_scale,
                                  self._sink_where(int(at[0])), signed=self.signed_label())
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
        self.strip.show_strip(strip, tokens, st.colormap, st.colour_scale, st.log_scale, self._sink_where(strip.query))
        self.strip.mark_window(*self.plot.vb.viewRange()[0])

    def _sink_where(self, i: int) -> str:
        """gpt-oss: the strip's row's share given to the learned sink (row i of the sink column), else ""."""
        v = self.sink.values
        return f"; the sink takes {float(v[i]):.2f} (the keys share the rest)" if v is not None and i < len(v) else ""

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
            self.goto_box.failed(str(e))
            return None
        st.set_query(i)
        at = np.flatnonzero(self.shown_rows == i)
        pos = int(at[0]) if at.size else int(np.searchsorted(self.shown_rows, i))
        x, y = view_around(pos, len(self.tokens), len(self.col_tokens),
                           self.left_axis.tokens_that_fit(), self.bottom_axis.tokens_that_fit())
        self.plot.setRange(xRange=x, yRange=y, padding=0)
        self.goto_box.went_to(i, m.rows[i])
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
        q = int(np.flatnonzero(self.shown_rows == st.query)[0]) if (self.shown_rows == st.query).any() else None
        sink = sink_text(self.sink.values, q, self.tokens[q] if q is not None and q < len(self.tokens) else "")
        sink = f"<br>Sink (left column): {html.escape(sink)}." if sink else ""
        sink += mx.head_note(info, l, h) if m.stack == "encoder" else ""  # a hybrid's signed or absent head
        self.title.setText(marked(st, f"{html.escape(what)}<b>Layer {l}{kind}, head {h}</b> — {count}, "
                                      f"dk scale {r.dk_scale:.2f}×{causal}{tag}{sink}"))

    def _options(self):
        style_colorbar(self.colorbar, self.state.colormap, self.state.log_scale)
        self.scale_combo.show_scale(self.state.colour_scale)
        self.refresh()

    def _cleared(self) -> None:
        """The input was emptied: the strip, read-outs and any window on its way go with the map."""
        self.long_map.cancel()
        self.state.cancel(STRIP_LANE)
        self.long_map.forget()
        self._head = None
        self.strip.clear()
        self.goto_box.forget()
        self.readout.setText(HOVER_HINT)
        self.title.setText("")  # it described the map that went

    # --------------------------------------------------------------------------------- pointer
    def describe(self, i: int, j: int) -> str:
        """`query "it" → key "animal": 0.43` for row i, column j (of the dense map drawn)."""
        if self.signed_label():
            return (f'query "{self.tokens[i]}" → key "{self.col_tokens[j]}": '
                    + mx.value_text(float(self.matrix[i, j]), True))
        return cell_text(self.tokens, self.col_tokens, self.matrix, i, j)

    def describe_long(self, i: int, j: int) -> str | None:
        """What the pointer is over in a long map: one weight at full resolution, else the pooled cell."""
        return window_cell_text((self.long_map.window, self.long_map.base), self.tokens, self.col_tokens, i, j)

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
        over_sink = self.sink.hovered(scene_pos, self.tokens)
        if over_sink is not None:
            self.readout.setText(over_sink)
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
