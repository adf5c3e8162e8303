"""The token-focus page: pick a token, see where it looks in every head ("attention from it").

A strip of tokens to click; below it one heatmap with a row per head (L·H rows, layer by layer) and a
column per key token; and the sentence shaded by the selected head's weights. A toggle hides special
tokens ([CLS], [SEP], BOS...) and renormalises each row over the remaining keys.

Long inputs stay legible: past FOCUS_WINDOW keys the heatmap shows a window of keys centred on the
query (drag or wheel to move along), and the shaded sentence a stretch of tokens around it.
"""
from __future__ import annotations

import html
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QHBoxLayout, QLabel, QListView, QListWidget, QListWidgetItem,
                               QVBoxLayout, QWidget)

from superqt.utils import signals_blocked

from attn_explorer.gui.widgets.heatmap import (CanvasStack, LazyPage, PaintedGraphicsWidget, TokenAxis, add_heat_image,
                                       display_values, follow_loading, lut_rgb, style_colorbar)
from attn_explorer.gui.explorer.controls import StackSwitch
from attn_explorer.gui.explorer.mixer_marks import MixerOverlay
from attn_explorer.session import mixers as mx
from attn_explorer.gui.explorer.sink_column import SinkColumn
from attn_explorer.maths import kept_tokens, rows_without_specials
from attn_explorer.session.long_view import FOCUS_LANE, query_rows_job, result_tag
from attn_explorer.session.stacks import STACK_NAMES, short_kind
from attn_explorer.session.state import SessionState


FOCUS_WINDOW = 64  # most key columns shown at once; more and the labels could not be read
SENTENCE_SPAN = 16  # tokens either side of the query in the shaded sentence
STRIP_TOKENS = 600  # most tokens the clickable strip holds (a stretch around the query: a list of 32,768 is slow)


def key_window(K: int, centre: int, width: int = FOCUS_WINDOW) -> tuple[int, int]:
    """[lo, hi) of `width` keys (all of them when K <= width) with `centre` inside, clamped to 0..K."""
    if K <= width:
        return 0, K
    lo = min(max(0, centre - width // 2), K - width)
    return lo, lo + width


def focus_rows(att: np.ndarray, query: int, special: np.ndarray, hide_special: bool) -> tuple[np.ndarray, np.ndarray]:
    """(L·H, K) rows of attention from `query`, and the key indices they cover. `special` marks the key
    columns (the source's, for cross-attention's target × source maps)."""
    L, H, _, C = att.shape
    rows = att[:, :, query, :].reshape(L * H, C)
    if not hide_special:
        return rows, np.arange(C)
    return rows_without_specials(rows, special), kept_tokens(special, C)


class TokenStrip(QListWidget):
    """The input's tokens in a wrapping row; clicking one makes it the query."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setFlow(QListView.LeftToRight)
        self.setWrapping(True)
        self.setResizeMode(QListView.Adjust)
        self.setSpacing(2)
        self.setUniformItemSizes(False)
        self.setMaximumHeight(86)
        self.setSelectionMode(QListWidget.SingleSelection)

    def set_tokens(self, tokens: list[str], special: np.ndarray, offset: int = 0) -> None:
        """Show tokens (those from index `offset` on: a long input's stretch around the query)."""
        with signals_blocked(self):
            self.clear()
            for i, t in enumerate(tokens):
                it = QListWidgetItem(t)
                it.setData(Qt.UserRole, offset + i)
                if special[i]:
                    it.setForeground(Qt.gray)
                self.addItem(it)

    def sizeHint(self):  # noqa: N802
        return QSize(400, 60)


class TokenFocusView(LazyPage, QWidget):
    inside_requested = Signal(int)  # a token was double-clicked: look inside the selected head for it

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.strip = TokenStrip()
        self.hide_special = QCheckBox("Hide special tokens")
        self.hide_special.setToolTip("Hide [CLS], [SEP], BOS and the like, and renormalise each row over the "
                                     "remaining keys (in every view)")
        self.hide_special.setChecked(state.hide_special)
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        self.sentence = QLabel("")
        self.sentence.setWordWrap(True)
        self.sentence.setTextFormat(Qt.RichText)
        self.canvas = PaintedGraphicsWidget()
        self.stack = CanvasStack(self.canvas)
        self.placeholder = self.stack.placeholder
        self.bottom_axis = TokenAxis("bottom", rotate=True)
        self.plot = self.canvas.addPlot(axisItems={"bottom": self.bottom_axis})
        self.plot.invertY(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=True, y=False)
        self.plot.setLabel("left", "layer (one row per head)")
        self.plot.setLabel("bottom", "key")
        self.image, self.colorbar = add_heat_image(self.plot, state.colormap)
        self.mixers = MixerOverlay(self.plot)  # a hybrid's recurrent rows (signed) and absent heads (issue 25)
        self.separators = pg.PlotCurveItem(connect="pairs", pen=pg.mkPen("w", width=2))
        self.plot.addItem(self.separators)
        self.sink = SinkColumn(self.plot, self.bottom_axis)  # gpt-oss: each head's sink share of the query's row
        self.marker = pg.PlotCurveItem(pen=pg.mkPen("#ff3b30", width=2))
        self.plot.addItem(self.marker)
        self.rows: np.ndarray | None = None
        self.keys: np.ndarray | None = None
        self._tokens: list[str] = []
        self._heads = 0  # heads per layer of the rows drawn
        self._key_labels: list[str] = []  # the key axis' labels as last set
        self._centred: tuple | None = None  # (tokens, query, keys shown) the key window was centred for
        self._strip_span = (0, 0)  # [lo, hi) of the tokens the strip holds
        self._layers: tuple = (0, 0, ())  # (L, H, layer kinds) of the rows drawn, for the left axis' labels
        self._focus = None  # long inputs: session.long_view.QueryRows of the query shown

        top = QHBoxLayout()
        top.addWidget(QLabel("Click a token (double-click: look inside the head):"))
        top.addStretch(1)
        self.stack_switch = StackSwitch(state)
        top.addWidget(self.stack_switch)
        top.addWidget(self.hide_special)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(self.strip)
        lay.addWidget(self.caption)
        lay.addWidget(self.stack, 1)
        lay.addWidget(self.sentence)

        self.strip.currentRowChanged.connect(self._strip_clicked)
        self.strip.itemDoubleClicked.connect(self._strip_double_clicked)
        self.hide_special.toggled.connect(lambda on: state.set_options(hide_special=on))
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        self.plot.vb.sigResized.connect(self._layer_ticks)
        state.attention_ready.connect(self.refresh)
        state.query_changed.connect(lambda *_: self.refresh())
        state.selection_changed.connect(lambda *_: self.refresh())
        state.options_changed.connect(self._options)
        follow_loading(state, self.stack.show_message)

    def _strip_clicked(self, row: int) -> None:
        item = self.strip.item(row) if row >= 0 else None
        if item is not None:
            self.state.set_query(int(item.data(Qt.UserRole)))

    def _strip_double_clicked(self, item) -> None:
        i = int(item.data(Qt.UserRole))
        self.state.set_query(i)
        if self.state.shown_stack == "encoder":  # "Inside a head" opens the encoder's (the source's) heads
            self.inside_requested.emit(i)

    def _clicked(self, ev) -> None:
        if self.rows is None or not self._heads:
            return
        p = self.plot.vb.mapSceneToView(ev.scenePos())
        k = int(np.floor(p.y()))
        if 0 <= k < self.rows.shape[0] and p.x() >= -self.sink.width:
            self.state.select(k // self._heads, k % self._heads)

    def _options(self) -> None:
        with signals_blocked(self.hide_special):
            self.hide_special.setChecked(self.state.hide_special)
        style_colorbar(self.colorbar, self.state.colormap, self.state.log_scale)
        self.refresh()

    def refresh(self, *_):
        r = self.result_to_draw()
        if r is None:
            return
        self.stack.show_canvas()
        m = self.state.maps(r)
        L, H, R, N = m.attentions.shape
        self._heads = H
        key_title = {"encoder": "key", "decoder": "target token (key)", "cross": "source token (key)"}[m.stack]
        if self.plot.getAxis("bottom").labelText != key_title:
            self.plot.setLabel("bottom", key_title)
        q = min(self.state.query, R - 1)
        lo, hi = self._strip_span
        if m.rows != self._tokens or not lo <= q < hi:  # a long input's strip holds a stretch around the query
            self._tokens = list(m.rows)
            lo, hi = self._strip_span = key_window(R, q, STRIP_TOKENS)
            self.strip.set_tokens(self._tokens[lo:hi], m.row_special[lo:hi], lo)
        with signals_blocked(self.strip):
            self.strip.setCurrentRow(q - lo)
        if getattr(r, "is_lazy", False):  # a long input: the query's row of every head comes from its lane
            got = self._focus
            if got is None or (got.tag, got.query) != (result_tag(r), q):
                self._ask_focus(r, q)
                return
            rows, keys = got.values, np.arange(N)
            if self.state.hide_special:
                rows, keys = rows_without_specials(rows, m.col_special), kept_tokens(m.col_special, N)
        else:
            rows, keys = focus_rows(m.attentions, q, m.col_special, self.state.hide_special)
            if self.state.hide_special and m.stack == "encoder":  # a recurrent layer's signed rows: not renormalised
                for l in mx.recurrent_layers(self.state.info):
                    rows[l * H:(l + 1) * H] = m.attentions[l, :, q][:, keys]
        rows, sink = self._with_sink(r, m, q, rows, keys)
        self.rows, self.keys = rows, keys
        self.sink.set(sink)
        self.sink.paint(rows, "weight", self.state.log_scale, self.state.colormap)
        lead = self.sink.width
        values, levels = display_values(rows, self.state.log_scale)
        self.image.setImage(values, levels=levels, autoLevels=False)
        K = len(keys)
        self.image.setRect(QRectF(0, 0, K, L * H))
        info = self.state.info if m.stack == "encoder" and self.state.info is not None else None
        self.mixers.show(mx.rows_overlay(rows, info, L, H) if info is not None else None,
                         QRectF(0, 0, K, L * H), info)
        labels = [m.cols[k] for k in keys]
        if labels != self._key_labels:  # measuring 512 labels and relaying the axis out is not free
            self._key_labels = labels
            self.bottom_axis.set_labels(labels)
        kinds = self.state.layer_kinds() if m.stack == "encoder" else ()
        self._layers = (L, H, kinds)
        self._layer_ticks()
        xs, ys = [], []
        for l in range(1, L):
            xs += [-lead, K]
            ys += [l * H, l * H]
        self.separators.setData(np.array(xs, float), np.array(ys, float))
        sel = self.state.layer * H + self.state.head
        self.marker.setData(np.array([-lead, K, K, -lead, -lead], float),
                            np.array([sel, sel, sel + 1, sel + 1, sel], float))
        # the query's column (or where it would be, if hidden); cross-attention's keys are another text
        at = int(np.searchsorted(keys, q)) if m.square else 0
        centred = (self._tokens, list(m.cols), q, K, lead)
        if centred != self._centred:  # a new query or input: the window goes to the query
            self._centred = centred
            lo, hi = key_window(K, at)
            vb = self.plot.getViewBox()
            vb.setLimits(xMin=-lead, xMax=K, yMin=0, yMax=L * H, maxXRange=max(FOCUS_WINDOW, 1) + lead,
                         minXRange=min(K, 4))
            self.plot.setRange(xRange=(lo - lead if lo == 0 else lo, hi), yRange=(0, L * H), padding=0)
        what = f"{STACK_NAMES[m.stack]}: " if r.decoder_attentions is not None else ""
        side = "source " if m.stack == "cross" else "target " if m.stack == "decoder" else ""
        who = "target token" if m.stack != "encoder" else "token"
        self.caption.setText(f'{html.escape(what)}Attention <b>from "{html.escape(m.rows[q])}"</b> ({who} {q}) in every '
                             f"head; the red box is layer {self.state.layer}, head {self.state.head}. "
                             + (f"{K:,} of {N:,} {side}tokens as keys ({N - K} special hidden, rows renormalised)."
                                if K < N else f"All {N:,} {side}tokens as keys.")
                             + (f" {FOCUS_WINDOW} of {K:,} keys at a time: drag sideways for the rest."
                                if K > FOCUS_WINDOW else "")
                             + (f" The left column is each head's learned <b>sink</b>: the share of the row it takes "
                                f"(the red box's: {float(sink[sel]):.0%})." if sink is not None else ""))
        if self.mixers.rgba is not None:
            self.caption.setText(self.caption.text() + " Recurrent layers' rows are signed implicit maps (blue &lt; 0 "
                                 "&lt; red, white = 0); grey rows: heads a layer does not have.")
        self._shade_sentence(m, rows[sel], keys, at)

    def _with_sink(self, r, m, q: int, rows: np.ndarray, keys: np.ndarray):
        """(rows, each head's sink share of query q's row, or None): gpt-oss's learned sinks (RunResult.sinks).
        With specials hidden, each row is renormalised over the kept keys and the sink, not the keys alone."""
        sinks = getattr(r, "sinks", None)
        if sinks is None or m.stack != "encoder":
            return rows, None
        s = np.asarray(sinks[:, :, q], dtype=np.float32).reshape(-1)  # (L·H,)
        if len(keys) == m.attentions.shape[-1]:
            return rows, s
        raw = np.asarray(self._raw_rows(r, m, q), dtype=np.float32)[:, keys]
        total = raw.sum(-1) + s
        ok = total > 0
        return (np.divide(raw, total[:, None], out=np.zeros_like(raw), where=ok[:, None]),
                np.divide(s, total, out=np.zeros_like(s), where=ok))

    def _raw_rows(self, r, m, q: int) -> np.ndarray:
        """Query q's rows in every head over every key, before any renormalisation."""
        if getattr(r, "is_lazy", False):
            return self._focus.values
        L, H, _, C = m.attentions.shape
        return m.attentions[:, :, q, :].reshape(L * H, C)

    def _layer_ticks(self, *_) -> None:
        """A label a layer, or every k-th when the layers are thinner than a line (30 layers at 700 px)."""
        L, H, kinds = self._layers
        if not L:
            return
        line = self.fontMetrics().height() + 1
        tall = self.plot.vb.height()
        step = max(1, math.ceil(L * line / tall)) if tall > 0 else 1
        self.plot.getAxis("left").setTicks([[((l + 0.5) * H, f"L{l} · {short_kind(kinds[l])}" if l < len(kinds)
                                              else f"L{l}") for l in range(0, L, step)], []])

    def _ask_focus(self, r, q: int) -> None:
        """Ask the focus lane for query q's row in every head of a long input; until it comes, the page says so
        (the old query's rows are not left on screen)."""
        self.rows = None
        self.image.clear()
        self.sentence.setText("")
        self.caption.setText(f"Computing token {q:,}'s row in every head from q and k…")
        want = (result_tag(r), q)

        def arrived(got) -> None:
            now = self.state.result
            if now is not None and (result_tag(now), min(self.state.query, now.num_tokens - 1)) == want:
                self._focus = got
                self.refresh()

        self.state.submit(query_rows_job, r, q, key=FOCUS_LANE, uses_model=False, on_result=arrived)

    def _shade_sentence(self, m, row: np.ndarray, keys: np.ndarray, at: int) -> None:
        """The key tokens around column `at`, shaded by the selected head's weights."""
        lut = lut_rgb(self.state.colormap)
        peak = float(row.max()) if row.size else 1.0
        lo, hi = key_window(len(keys), at, 2 * SENTENCE_SPAN + 1)
        parts = ["…"] if lo > 0 else []
        signed = m.stack == "encoder" and mx.is_recurrent(self.state.info, self.state.layer)
        shades = mx.signed_shade(row[lo:hi]) if signed else None
        for i, (w, k) in enumerate(zip(row[lo:hi], keys[lo:hi])):
            c = shades[i] if signed else lut[int(np.clip(w / peak if peak > 0 else 0, 0, 1) * 255)]
            light = (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]) > 140
            fg = "#000" if light else "#fff"
            parts.append(f'<span style="background-color: rgb({c[0]},{c[1]},{c[2]}); color: {fg};">'
                         f"&nbsp;{html.escape(m.cols[k])}&nbsp;</span>")
        if hi < len(keys):
            parts.append("…")
        where = f" (tokens {keys[lo]}–{keys[hi - 1]} of {len(m.cols)})" if lo > 0 or hi < len(keys) else ""
        how = (f"{mx.mixer_label(self.state.info, self.state.layer)}, signed: blue &lt; 0 (white) &lt; red"
               if signed else f"shaded by weight (darkest = 0, brightest = {peak:.2f})")
        self.sentence.setText(f"L{self.state.layer} H{self.state.head}, {how}{where}: " + " ".join(parts))
