"""The logit-lens page: a layer × position table of each residual stream's top next tokens, and the direct logit
attribution of one next token (which heads and MLPs wrote its logit), with the frozen-norm convention on screen.

The numbers come from `session.lens` jobs; this module only draws, in the frame of `tool.ToolPage`.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QHeaderView, QLabel, QPushButton, QSplitter, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from attn_explorer.gui.interventions.tool import ToolPage, visible
from attn_explorer.gui.widgets.heatmap import PaintedGraphicsWidget, TokenAxis
from attn_explorer.gui.widgets.tables import shade
from attn_explorer.gui.widgets.tokens import TokenPicker
from attn_explorer.session.lens import CONVENTION, OWN, attribution_job, lens_job
from attn_explorer.session.state import SessionState

TOP_K = 5
BARS = 14  # pieces drawn in the attribution chart


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
            self.control_row.addWidget(w)
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
