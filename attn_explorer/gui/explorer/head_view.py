"""The head page: one head's N×N attention, large, with token labels on both axes.

Hovering a cell shows `query "it" → key "animal": 0.43`; a new result clears that line, since it
described the old map. The layer and head come from the session (spin boxes in the window's toolbar,
arrow keys); the colormap, linear/log scale and "hide special tokens" too. Long inputs stay legible:
the axes label as many tokens as fit, and the mouse wheel zooms in (drag pans) until every token has
its label.
"""
from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import QRectF, Signal
from PySide6.QtWidgets import QLabel, QWidget

from attn_explorer.gui.widgets.heatmap import (CanvasStack, LazyPage, PaintedGraphicsWidget, TokenAxis, add_heat_image,
                                       cell_under, display_values, follow_loading, style_colorbar)
from attn_explorer.gui.explorer.controls import StackSwitch, titled_page
from attn_explorer.maths import hidden_tokens, kept_tokens, renormalise_without, without_specials
from attn_explorer.session.inputs import STACK_NAMES, StackMaps
from attn_explorer.session.state import SessionState

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


class HeadView(LazyPage, QWidget):
    """One large heatmap of the selected head. Double-clicking a row asks to look inside the head for that
    query token (`inside_requested(token index)`; the window opens the "Inside a head" lesson)."""

    inside_requested = Signal(int)

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.title = QLabel("")
        self.title.setWordWrap(True)  # a long header (stack, layer kind, counts) wraps instead of widening the window
        self.readout = QLabel(HOVER_HINT)
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
        self.image, self.colorbar = add_heat_image(self.plot, state.colormap)
        self.matrix: np.ndarray | None = None
        self.tokens: list[str] = []  # the rows' labels (the queries)
        self.col_tokens: list[str] = []  # the columns' labels (the keys)
        self.shown_rows: np.ndarray = np.arange(0)  # row i of the map is the stack's row shown_rows[i]
        self.stack_shown = "encoder"

        self.stack_switch = StackSwitch(state)
        lay = titled_page(self, self.title, self.stack_switch)
        lay.addWidget(self.stack, 1)
        lay.addWidget(self.readout)

        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        state.attention_ready.connect(self.refresh)
        state.selection_changed.connect(lambda *_: self.refresh())
        state.options_changed.connect(self._options)
        state.model_loading.connect(lambda *_: self.readout.setText(HOVER_HINT))
        follow_loading(state, self.stack.show_message)

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
        self.matrix, rows, cols, self.shown_rows = stack_matrix(m, l, h, st.hide_special)
        values, levels = display_values(self.matrix, st.log_scale)
        self.image.setImage(values, levels=levels, autoLevels=False)
        R, C = self.matrix.shape
        self.image.setRect(QRectF(0, 0, C, R))
        if m.stack != self.stack_shown:
            self.stack_shown = m.stack
            left, bottom = AXIS_TITLES[m.stack]
            self.plot.setLabel("left", left)
            self.plot.setLabel("bottom", bottom)
            self.tokens = []  # lay the axes out again for the other stack's tokens
        if rows != self.tokens or cols != self.col_tokens:
            self.tokens, self.col_tokens = rows, cols
            self.left_axis.set_labels(rows)
            self.bottom_axis.set_labels(cols)
            vb = self.plot.getViewBox()
            vb.setLimits(xMin=0, xMax=C, yMin=0, yMax=R, minXRange=min(C, 4), minYRange=min(R, 4))
            self.plot.setRange(xRange=(0, C), yRange=(0, R), padding=0)
        info = st.info
        tag = "" if info is None or info.trained else "  (untrained model: random weights)"
        kinds = st.layer_kinds()
        kind = f" ({html.escape(kinds[l])})" if l < len(kinds) else ""
        if m.stack == "encoder":
            causal = " — causal: no weight above the diagonal" if info is not None and info.causal else ""
            count = shown_count(r, R)
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
        self.refresh()

    def describe(self, i: int, j: int) -> str:
        """`query "it" → key "animal": 0.43` for row i, column j."""
        return f'query "{self.tokens[i]}" → key "{self.col_tokens[j]}": {self.matrix[i, j]:.2f}'

    def _clicked(self, ev) -> None:
        r = self.state.result
        if not ev.double() or self.matrix is None or r is None:
            return
        i = int(np.floor(self.plot.vb.mapSceneToView(ev.scenePos()).y()))
        shown = self.shown_rows  # row i: the i-th shown
        if 0 <= i < len(shown):
            self.state.set_query(int(shown[i]))
            if self.stack_shown == "encoder":  # "Inside a head" opens the encoder's (the source's) heads
                self.inside_requested.emit(int(shown[i]))

    def _hovered(self, scene_pos):
        if self.matrix is None:
            return
        hit = cell_under(self.plot, scene_pos, self.matrix.shape)
        if hit is not None:
            self.readout.setText(self.describe(*hit))
