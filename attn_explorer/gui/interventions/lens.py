"""The logit-lens page: a layer × position table of each residual stream's top next tokens, and the direct logit
attribution of one next token (which heads and MLPs wrote its logit), with the frozen-norm convention on screen.

Also `ToolPage`, the frame the contribution-graph and why-this-head pages share: a caption, a bar of controls,
a progress bar with Cancel for the page's worker job, the content (a message can replace it) and a read-out.
The numbers come from `session.lens` jobs; this module only draws.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QHBoxLayout, QHeaderView, QLabel,
                               QProgressBar, QPushButton, QSizePolicy, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

from attn_explorer.gui.widgets.heatmap import CanvasStack, LazyPage, PaintedGraphicsWidget, TokenAxis
from attn_explorer.gui.widgets.tables import shade
from attn_explorer.gui.widgets.tokens import TokenPicker, token_text
from attn_explorer.session.lens import CONVENTION, OWN, attribution_job, lens_job
from attn_explorer.session.state import SessionState

NOT_A_DECODER = ("{what} needs a decoder with next-token logits (SmolLM2, Gemma 3, GPT-2); {name} is not one. "
                 "Pick a decoder in the Model box.")
TOP_K = 5
BARS = 14  # pieces drawn in the attribution chart


def visible(token: str, width: int = 10) -> str:
    """A token as a cell can show it: white space drawn (␣ space, ↵ newline, ⇥ tab, ∅ nothing), cut to width."""
    return token_text(token, width)


def is_decoder(info) -> bool:
    return info is not None and info.modality == "text" and info.causal and info.can_generate


class ToolPage(LazyPage, QWidget):
    """A page frame with one worker job at a time on screen: progress, Cancel, and a message in its place."""

    head_opened = Signal(int, int)  # layer, head: the user asked to see that head's map
    WHAT = "This page"  # for the not-a-decoder message
    follow_up_lanes: tuple = ()  # lanes of jobs that hang off the main one (cancelled with it)
    AGAIN = "Press Run to measure again."  # what brings the numbers back after a cancel
    MEASURED = "Measured: drawing…"  # the page's line once the bar reaches 100 % (the result is on its way)

    def __init__(self, state: SessionState, content: QWidget, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        self.caption.setTextFormat(Qt.RichText)
        self.bar = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setMaximumWidth(180)
        # tall enough for its text ("Logit lens 40%"), whatever the row's other controls ask for
        self.progress.setMinimumHeight(self.progress.fontMetrics().height() + 8)
        self.progress.hide()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.hide()
        self.cancel_button.clicked.connect(self.cancel)
        self.stack = CanvasStack(content, "Load a decoder to use this page.")
        # the content takes the height the window has, never asks for more (a page that scrolls hides its axis)
        self.stack.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Ignored)
        self.stack.setMinimumHeight(260)
        self.readout = QLabel("")
        self.readout.setWordWrap(True)
        self.readout.setTextFormat(Qt.RichText)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.unused = QLabel("")  # which of the window's drawing options this page does not use
        self.unused.setWordWrap(True)
        self.unused.setStyleSheet("color: #666; font-style: italic;")
        self.unused.hide()
        lay.addWidget(self.caption)
        lay.addWidget(self.unused)
        lay.addLayout(self.bar)
        lay.addWidget(self.stack, 1)
        lay.addWidget(self.readout)
        self._lane: str | None = None  # the lane of the job on screen
        self.done_for = None  # the RunResult the page's numbers belong to
        state.attention_ready.connect(lambda *_: self.refresh())
        state.model_loading.connect(self._loading)
        state.model_loaded.connect(lambda *_: self._forget())
        state.input_cleared.connect(lambda: self._cleared())
        state.options_changed.connect(self._say_unused)
        self._say_unused()

    def finish_bar(self) -> None:
        self.bar.addStretch(1)
        self.bar.addWidget(self.progress)
        self.bar.addWidget(self.cancel_button)

    # --------------------------------------------------------------------------- jobs
    def start(self, job, *args, key: str, on_result, message: str) -> bool:
        """Run job(model, *args) in lane `key`, with progress and Cancel; False when there is no model."""
        self._lane = key
        self.progress.setValue(0)
        self.progress.setFormat(message + " %p%")
        started = self.state.submit(job, *args, key=key, on_result=lambda v: self._arrived(key, on_result, v),
                                    on_error=lambda msg: self._failed(key, msg), on_progress=self._progressed)
        self.progress.setVisible(started)
        self.cancel_button.setVisible(started)
        return started

    def _progressed(self, fraction: float, _message: str) -> None:
        self.progress.setValue(int(round(100 * fraction)))
        if fraction >= 1 and self.stack.currentWidget() is self.stack.placeholder:
            self.stack.show_message(self.MEASURED)  # the bar says 100 %: the line no longer says "reading"

    def _arrived(self, key: str, on_result, value) -> None:
        self._job_ended(key)
        on_result(value)

    def _job_ended(self, key: str) -> None:
        if key == self._lane:
            self.progress.hide()
            self.cancel_button.hide()
            self._lane = None

    def cancel(self) -> None:
        """Stop the job on screen; the page says so (the last numbers are gone with the input they were for)."""
        if self._lane is None:
            return
        for lane in self.follow_up_lanes:
            self.state.cancel(lane)
        self.state.cancel(self._lane)
        self._job_ended(self._lane)
        self.done_for = None
        self.stack.show_message(f"Cancelled. {self.AGAIN}")
        self.caption.setText("")
        self.readout.setText("")

    def _failed(self, key: str, message: str) -> None:
        """The job failed: its one line goes to the banner, and the page points there."""
        self._job_ended(key)
        self.done_for = None
        self.caption.setText("")
        self.readout.setText("")
        self.stack.show_message("This page could not be drawn: the message at the top of the window says why.")
        self.state.error_raised.emit(message)

    # --------------------------------------------------------------------------- what to draw
    def usable(self):
        """The result to measure now, or None (with the page saying why): no decoder, no input, hidden."""
        info = self.state.info
        if info is not None and not is_decoder(info):
            self.done_for = None
            self.stack.show_message(NOT_A_DECODER.format(what=self.WHAT, name=info.name))
            self.caption.setText("")
            self.readout.setText("")
            return None
        return self.result_to_draw()

    def _forget(self) -> None:
        self.done_for = None

    def _loading(self, src: str) -> None:
        """Another model is coming: this page's numbers belong to the old one, so they go."""
        self._cleared(f"Loading {src or 'the model'}…")

    def _say_unused(self) -> None:
        parts = []
        if self.state.hide_special:
            parts.append("Hide specials: not used here — every token writes into the residual stream.")
        if self.state.log_scale:
            parts.append("Log scale: not used here — the numbers are logits, probabilities and shares.")
        self.unused.setText(" ".join(parts))
        self.unused.setVisible(bool(parts))

    def _cleared(self, message: str = "Type or paste some text.") -> None:
        """The input is gone (or the model is being replaced): stop the job, drop the numbers, say why."""
        for lane in self.follow_up_lanes:
            self.state.cancel(lane)
        if self._lane is not None:
            self.state.cancel(self._lane)
            self._job_ended(self._lane)
        self.done_for = None
        self.caption.setText("")
        self.readout.setText("")
        self.stack.show_message(message)

    def open_head(self, layer: int, head: int) -> None:
        self.state.select(layer, head)
        self.head_opened.emit(int(layer), int(head))


class LensTable(QTableWidget):
    """Rows: the residual stream after each layer (the last at the top, the embeddings at the bottom); columns:
    positions. Each cell: that stream's top next token, shaded by its probability; the tooltip lists the top k."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.SingleSelection)
        self.verticalHeader().setDefaultSectionSize(20)
        self.horizontalHeader().setDefaultSectionSize(66)
        # the positions share the width there is (a cell elides its token), so 1024 px needs no sideways scroll;
        # only a text too long for 20 px a column scrolls (at 1024 px about 16 positions fit)
        self.horizontalHeader().setMinimumSectionSize(20)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        self.setTextElideMode(Qt.ElideRight)
        self.setWordWrap(False)
        font = self.font()  # a point smaller: a narrow cell keeps a few characters of its token before the "…"
        font.setPointSizeF(max(7.0, font.pointSizeF() - 1))
        self.setFont(font)
        self.horizontalHeader().setFont(font)
        self.verticalHeader().setSectionResizeMode(QHeaderView.Fixed)
        self.lens = None

    def level_of_row(self, row: int) -> int:
        return self.rowCount() - 1 - row

    def show_lens(self, lens) -> None:
        self.lens = lens
        rows = lens.row_names[::-1]
        L1, N, _ = lens.top_ids.shape
        self.clear()
        self.setRowCount(L1)
        self.setColumnCount(N)
        self.setVerticalHeaderLabels(rows)
        self.setHorizontalHeaderLabels([visible(t, 9) for t in lens.tokens])  # the position: in the tooltip
        for j, t in enumerate(lens.tokens):
            self.horizontalHeaderItem(j).setToolTip(f"position {j}: {visible(t, 40)}")
        for r in range(L1):
            level = self.level_of_row(r)
            for j in range(N):
                p = float(lens.top_probs[level, j, 0])
                item = QTableWidgetItem(visible(lens.top_tokens[level][j][0]))
                item.setBackground(shade(p, 1.0, False))
                item.setForeground(QColor("black"))
                tips = "\n".join(f"{visible(t, 20)}  {float(q):.3f}"
                                 for t, q in zip(lens.top_tokens[level][j], lens.top_probs[level, j]))
                item.setToolTip(f"{rows[r]}, position {j} ({lens.tokens[j]!r}): next token\n{tips}")
                self.setItem(r, j, item)

    def texts(self) -> list[list[str]]:
        return [[self.item(i, j).text() for j in range(self.columnCount())] for i in range(self.rowCount())]


class LensPage(ToolPage):
    WHAT = "The logit lens"
    follow_up_lanes = ("lens-attribution",)

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        self.table = LensTable()
        self.bars_canvas = PaintedGraphicsWidget()
        self.bar_axis = TokenAxis("left")
        self.bars_plot = self.bars_canvas.addPlot(axisItems={"left": self.bar_axis})
        self.bars_plot.invertY(True)
        self.bars_plot.setMenuEnabled(False)
        self.bars_plot.hideButtons()
        self.bars_plot.setMouseEnabled(x=False, y=False)
        self.bars_plot.setLabel("bottom", "logit contribution")  # short: the pane is narrow at 1024 px
        self.bars_plot.getAxis("bottom").enableAutoSIPrefix(False)
        self.bars = pg.BarGraphItem(x0=[], y=[], height=0.7, width=[])
        self.bars_plot.addItem(self.bars)
        self.bars_plot.addItem(pg.InfiniteLine(pos=0, angle=90, pen=pg.mkPen("#888")))
        self.dla_title = QLabel("")
        self.dla_title.setWordWrap(True)
        self.dla_title.setTextFormat(Qt.RichText)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.dla_title)
        rl.addWidget(self.bars_canvas, 1)
        self.splitter = QSplitter(Qt.Horizontal)
        self.splitter.addWidget(self.table)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 3)
        self.splitter.setStretchFactor(1, 2)
        self.splitter.setSizes([700, 300])  # the table gets the larger share until the user moves the handle
        super().__init__(state, self.splitter, parent)
        self.norm_box = QComboBox()
        self.norm_box.addItem("frozen scale (adds up)", "frozen")
        self.norm_box.addItem("each layer's own scale", "own")
        self.norm_box.setToolTip("How each layer's residual stream goes through the final norm before W_U")
        self.target_edit = TokenPicker()  # the lens's top tokens at the attributed position, to pick from
        self.target_edit.setPlaceholderText("the model's own next token")
        self.target_edit.setToolTip("The token whose logit is split into its pieces: pick one of the lens's top "
                                    "tokens or type one, a leading space as ␣ (␣Paris is ' Paris'), or an id")
        self.target_edit.setMaximumWidth(200)
        self.run_button = QPushButton("Run")
        self.run_button.setToolTip("Measure the lens and the attribution again")
        for w in (QLabel("Final norm:"), self.norm_box, QLabel("Attribute:"), self.target_edit, self.run_button):
            self.bar.addWidget(w)
        self.finish_bar()
        self.position = -1  # the position attributed (-1: the last)
        self.attribution = None
        self.pieces: list[tuple[str, float]] = []  # the bars drawn, top to bottom
        self.norm_box.currentIndexChanged.connect(lambda *_: self.measure())
        self.target_edit.returnPressed.connect(self.measure_attribution)
        self.run_button.clicked.connect(self.measure)
        state.model_loaded.connect(lambda *_: self.target_edit.clear())  # another vocabulary: its tokens go
        self.table.cellClicked.connect(self._cell_clicked)
        self.bars_canvas.scene().sigMouseClicked.connect(self._bar_clicked)

    # --------------------------------------------------------------------------- measuring
    def refresh(self) -> None:
        r = self.usable()
        if r is None or r is self.done_for:
            return
        self.position = -1
        self.measure()

    def measure(self) -> None:
        """The lens (the table), then the attribution: each in its own lane, the newest request winning."""
        r = self.usable()
        if r is None:
            return
        self.done_for = r
        self.state.cancel("lens-attribution")  # an attribution in flight belongs to the lens being replaced
        self.table.lens = None
        self.attribution = None
        self.readout.setText("")
        self.dla_title.setText("")
        self.stack.show_message("Reading every layer's residual stream through the unembedding…")
        x, kw = self.state.run_input()
        norm = self.norm_box.currentData()
        self.start(lens_job, x, kw, TOP_K, norm, key="lens-table", on_result=lambda lens: self._lens_ready(r, lens),
                   message="Logit lens")

    def measure_attribution(self) -> None:
        r = self.done_for
        if r is None or self.table.lens is None:
            return
        x, kw = self.state.run_input()
        target = self.target_edit.text()
        self.dla_title.setText("Splitting the logit into its pieces…")
        self._clear_bars()
        self.state.submit(attribution_job, x, kw, self.position, target or None, key="lens-attribution",
                          on_result=lambda a: self._attribution_ready(r, a), on_error=self._attribution_failed)

    def _lens_ready(self, r, lens) -> None:
        if r is not self.state.result:
            return
        self.stack.show_canvas()
        self.table.show_lens(lens)
        conv = CONVENTION if lens.norm == "frozen" else OWN
        self.caption.setText(f"<b>Logit lens</b>: each layer's residual stream through the final norm and W_U; the top "
                             f"next token per cell, shaded by its probability (hover: top {TOP_K}). <i>{conv}</i> "
                             f"Click a cell to attribute that position.")
        self.measure_attribution()

    def _attribution_failed(self, message: str) -> None:
        self.dla_title.setText("")
        self.state.error_raised.emit(message)

    def _attribution_ready(self, r, a) -> None:
        if r is not self.state.result:
            return
        self.attribution = a
        self.position = a.position
        lens = self.table.lens
        if lens is not None and 0 <= a.position < len(lens.tokens):  # the final layer's top tokens here
            self.target_edit.set_tokens(list(lens.top_tokens[-1][a.position]))
        pieces = a.top(BARS)
        self.pieces = pieces
        vals = np.array([v for _, v in pieces])
        n = len(pieces)
        self.bars.setOpts(x0=np.minimum(vals, 0), width=np.abs(vals), y=np.arange(n) + 0.5, height=0.7,
                          brushes=[pg.mkBrush("#4c72b0" if v >= 0 else "#c44e52") for v in vals])
        self.bar_axis.set_labels([name for name, _ in pieces])
        peak = float(np.abs(vals).max()) if n else 1.0
        self.bars_plot.setRange(xRange=(min(0.0, vals.min()) - 0.05 * peak, max(0.0, vals.max()) + 0.05 * peak),
                                yRange=(0, max(n, 1)), padding=0)
        tok = a.tokens[a.position]
        self.dla_title.setText(
            f"<b>Direct logit attribution</b> of <b>{visible(a.target, 16)}</b> after position {a.position} "
            f"({visible(tok, 16)}), frozen final norm: the {n} largest of {a.heads.size + a.mlps.size + 2} pieces. "
            f"Click a head to open its map.")
        self.readout.setText(
            f"All pieces sum to <b>{a.total:.4f}</b>; the model's logit of {visible(a.target, 16)} is <b>{a.logit:.4f}</b> "
            f"(p = {a.prob:.3f}). Heads: {a.heads.sum():+.3f}, MLPs: {a.mlps.sum():+.3f}, embeddings: "
            f"{a.embeddings:+.3f}, biases: {a.biases:+.3f}.")
        self.table.setCurrentCell(0, a.position)

    def _clear_bars(self) -> None:
        self.pieces = []
        self.bars.setOpts(x0=[], width=[], y=[], height=0.7)
        self.bar_axis.set_labels([])

    # --------------------------------------------------------------------------- clicks
    def _cell_clicked(self, row: int, col: int) -> None:
        if self.table.lens is None:
            return
        self.position = col
        self.measure_attribution()

    def bar_center(self, i: int):
        """Scene position of bar i's centre (tests click here)."""
        vb = self.bars_plot.getViewBox()
        _, v = self.pieces[i]
        return vb.mapViewToScene(pg.Point(v / 2, i + 0.5))

    def _bar_clicked(self, ev) -> None:
        if not self.pieces:
            return
        vb = self.bars_plot.getViewBox()
        if not vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        y = vb.mapSceneToView(ev.scenePos()).y()
        i = int(np.floor(y))
        if 0 <= i < len(self.pieces):
            self.open_piece(self.pieces[i][0])

    def open_piece(self, name: str) -> None:
        """A head's bar opens its map; other pieces say what they are."""
        if name.startswith("L") and " H" in name:
            layer, head = name[1:].split(" H")
            self.open_head(int(layer), int(head))
        else:
            self.readout.setText(f"{name}: not a head (no attention map to open).")
