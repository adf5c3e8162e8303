"""The switch-heads-off page: click heads in an L×H grid to switch them off (zero or mean) and see the effect at
once; run an ablation scan or an activation-patching experiment, with progress and Cancel; click a result
cell to open that head.

The effect is drawn in the form that fits the model: a decoder's next-token probabilities before and after,
a classifier's class probabilities, an encoder's sentence-embedding similarity with the clean run. The
numbers come from `session.interventions` jobs in worker lanes; this module only draws.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QProgressBar,
                               QPushButton, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from attn_explorer.gui.widgets.heatmap import (CanvasStack, LazyPage, PaintedGraphicsWidget, TokenAxis, cell_centre,
                                               cell_under, colormap)
from attn_explorer.gui.widgets.tokens import TokenPicker, token_text
from attn_explorer.session.interventions import SCANS, ablation_job, compare_job, patching_job
from attn_explorer.session.state import SessionState

COMPARE_LANE, SCAN_LANE = "interventions-compare", "interventions-scan"
OFF_COLOURS = pg.ColorMap([0.0, 1.0], [(236, 236, 236), (200, 40, 40)])  # on: light grey; off: red
BEFORE, AFTER = "#8c8c8c", "#dd8452"
TOP_ROWS = 40  # table rows of a scan (the largest effects)
TOP_TOKENS = 6  # bars: the most likely next tokens of either run (up to twice as many in all)
CAPTION = ("<b>Switch heads off</b> by clicking them in the left grid: their output before W_O becomes zero, or its "
           "mean over this input's positions; the bars compare the clean run (grey) with heads off (orange). A "
           "<b>scan</b> switches off, or patches, one cell at a time; click a result to open its head.")


class AblationPage(LazyPage, QWidget):
    head_opened = Signal(int, int)  # layer, head: the user asked to see that head
    scan_finished = Signal(bool)  # True: a scan's result is on screen; False: cancelled or failed
    compared = Signal()  # the effect of the heads switched off is on screen

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.off: set[tuple[int, int]] = set()  # heads switched off
        self.comparison = None  # session Comparison on screen
        self.scan = None  # session Scan on screen
        self._compared_for = None  # (input key, heads off, how) of `comparison`
        self._scan_for = None  # input key (and corrupt text) the scan belongs to
        self._build()
        state.attention_ready.connect(lambda *_: self.refresh())
        state.model_loaded.connect(self._model_changed)
        state.input_cleared.connect(self._cleared)

    # --------------------------------------------------------------------------- layout
    def _build(self) -> None:
        self.caption = QLabel(CAPTION)
        self.caption.setWordWrap(True)
        self.caption.setTextFormat(Qt.RichText)
        self.how = QComboBox()
        self.how.addItem("set to zero", "zero")
        self.how.addItem("set to its mean", "mean")
        self.how.setToolTip("What a head switched off outputs: zero, or its mean output over this input's positions")
        self.how.currentIndexChanged.connect(lambda *_: self._request_compare())
        self.clear_button = QPushButton("All heads on")
        self.clear_button.clicked.connect(self.clear_heads)
        self.off_label = QLabel("")
        self.off_label.setWordWrap(True)
        row1 = QHBoxLayout()
        for w in (QLabel("Heads off:"), self.how, self.clear_button):
            row1.addWidget(w)
        row1.addWidget(self.off_label, 1)

        self.scan_kind = QComboBox()
        for key, (text, title) in SCANS.items():
            self.scan_kind.addItem(text, key)
            self.scan_kind.setItemData(self.scan_kind.count() - 1, title, Qt.ToolTipRole)
        self.scan_kind.currentIndexChanged.connect(self._kind_changed)
        self.target = TokenPicker()  # the bars' tokens to pick from, so the target is the exact token measured
        self.target.setPlaceholderText("target (top token)")
        self.target.setToolTip("Decoders: the next token to measure; pick one of the bars' tokens or type one, its "
                               "leading space as ␣ (␣Mary is ' Mary', Mary another token); empty: the clean run's "
                               "most likely token. Classifiers: the class (empty: the top one)")
        self.foil = TokenPicker()
        self.foil.setPlaceholderText("foil (optional)")
        self.foil.setToolTip("Decoders: measure logit(target) − logit(foil) instead of log p(target); ␣ is a "
                             "leading space")
        self.corrupt = QLineEdit()
        self.corrupt.setPlaceholderText("corrupt text, as many tokens")
        self.corrupt.setToolTip("Patching: the clean text is the input; this is the corrupt one, with the same number "
                                "of tokens (e.g. the two names swapped)")
        for box in (self.target, self.foil):
            box.setMaximumWidth(130)
        self.run_button = QPushButton("Run scan")
        self.run_button.clicked.connect(self.run_scan)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(160)
        self.progress.hide()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.hide()
        self.cancel_button.clicked.connect(self.cancel_scan)
        self.scan_kind.setMaximumWidth(190)
        self.corrupt.setMaximumWidth(520)
        row2 = QHBoxLayout()
        for w in (self.scan_kind, self.target, self.foil):
            row2.addWidget(w)
        row2.addWidget(self.corrupt, 1)
        for w in (self.run_button, self.progress, self.cancel_button):
            row2.addWidget(w)
        row2.addStretch(0)

        self.effect_text = QLabel("")
        self.effect_text.setWordWrap(True)
        self.effect_text.setTextFormat(Qt.RichText)

        self.canvas = PaintedGraphicsWidget()  # the switches: one cell per head
        self.switch_plot = self._grid_plot(self.canvas, 0, 0)
        self.switch_image = pg.ImageItem(axisOrder="row-major")
        self.switch_plot.addItem(self.switch_image)
        self.switch_plot.setTitle("layer × head")
        self.canvas.scene().sigMouseClicked.connect(self._switch_clicked)
        self.canvas.setMinimumWidth(170)
        self.bars_canvas = PaintedGraphicsWidget()  # horizontal bars: the labels read across, unrotated
        self.bar_axis = TokenAxis("left")
        self.bar_axis.fit_every_label = True  # a dozen bars at most: each is named, in a smaller font if need be
        self.bars_plot = self.bars_canvas.addPlot(row=0, col=0, axisItems={"left": self.bar_axis})
        self.bars_plot.setMenuEnabled(False)
        self.bars_plot.hideButtons()
        self.bars_plot.setMouseEnabled(x=False, y=False)
        self.bars_plot.invertY(True)
        self.bars_plot.getAxis("bottom").enableAutoSIPrefix(False)
        self.before_bars = pg.BarGraphItem(x0=[], y=[], height=0.38, width=[], brush=BEFORE)
        self.after_bars = pg.BarGraphItem(x0=[], y=[], height=0.38, width=[], brush=AFTER)
        self.bars_plot.addItem(self.before_bars)
        self.bars_plot.addItem(self.after_bars)

        self.scan_canvas = PaintedGraphicsWidget()
        self.scan_axis = TokenAxis("bottom", rotate=True)
        self.scan_plot = self._grid_plot(self.scan_canvas, 0, 0, self.scan_axis)
        self.scan_image = pg.ImageItem(axisOrder="row-major")
        self.scan_plot.addItem(self.scan_image)
        self.scan_image.setLookupTable(colormap("CET-D1").getLookupTable(0, 1, 256))  # blue − white + red
        self.scan_canvas.scene().sigMouseClicked.connect(self._scan_clicked)
        self.scan_stack = CanvasStack(self.scan_canvas, "Run a scan to see every cell's effect here.")
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["#", "L", "H", "effect"])
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        for j, width in enumerate((34, 34, 38)):
            header.setSectionResizeMode(j, QHeaderView.Fixed)
            header.resizeSection(j, width)
        header.setStretchLastSection(True)
        self.table.setToolTip("# = rank by the size of the effect; L = layer; H = head (or the position, for a "
                              "scan per position). Click a column to sort by it, a row to open that head.")
        self.table.setSortingEnabled(True)
        self.table.setMinimumWidth(190)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.cellClicked.connect(self._row_clicked)
        results = QSplitter(Qt.Horizontal)
        results.addWidget(self.scan_stack)
        results.addWidget(self.table)
        results.setSizes([420, 190])  # proportions: the splitters share out the room there is
        right = QSplitter(Qt.Vertical)
        right.addWidget(self.bars_canvas)
        right.addWidget(results)
        right.setSizes([250, 250])
        split = _Splitter(Qt.Horizontal)
        self.stack = CanvasStack(self.canvas, "Load a model to switch its heads off.")
        split.addWidget(self.stack)
        split.addWidget(right)
        split.setSizes([180, 620])
        self.scan_text = QLabel("")
        self.scan_text.setWordWrap(True)
        self.scan_text.setTextFormat(Qt.RichText)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.caption)
        lay.addLayout(row1)
        lay.addWidget(self.effect_text)
        lay.addLayout(row2)
        lay.addWidget(split, 1)
        lay.addWidget(self.scan_text)
        self._kind_changed()

    @staticmethod
    def _grid_plot(canvas, row: int, col: int, bottom=None) -> pg.PlotItem:
        p = canvas.addPlot(row=row, col=col, axisItems={"left": TokenAxis("left"), "bottom": bottom or TokenAxis("bottom")})
        p.invertY(True)
        p.setMenuEnabled(False)
        p.hideButtons()
        p.setMouseEnabled(x=False, y=False)
        p.setLabel("left", "layer")
        return p

    # --------------------------------------------------------------------------- state
    def _input_key(self):
        x, kw = self.state.run_input()
        info = self.state.info
        return (None if info is None else info.name, x if isinstance(x, str) else id(x), tuple(sorted(kw.items())))

    def _model_changed(self, info) -> None:
        self.state.cancel(COMPARE_LANE)
        self.cancel_scan(quiet=True)
        self.off.clear()
        self.comparison = self._compared_for = None
        self._drop_scan("")
        self.target.clear()
        self.foil.clear()
        image = info.modality == "image"
        for i in (1, 2):  # patching takes a second text: text models only
            self.scan_kind.model().item(i).setEnabled(not image)
        if image:
            self.scan_kind.setCurrentIndex(0)
        self.refresh()

    def _cleared(self) -> None:
        self.state.cancel(COMPARE_LANE)
        self.cancel_scan(quiet=True)
        self.comparison = self._compared_for = None
        self._drop_scan("")
        self.effect_text.setText("")
        self.stack.show_message("Type some text (or open a picture) to switch heads off.")

    def _kind_changed(self, *_) -> None:
        kind = self.scan_kind.currentData()
        if self.scan is not None and self.scan.kind != kind:  # its rows and columns belong to the other kind
            self._drop_scan("")
        patching = kind != "ablation"
        self.corrupt.setVisible(patching)
        self.run_button.setText("Run patching" if patching else "Run scan")

    def refresh(self, *_) -> None:
        """A new result or the page shown: redraw the grid; the effect and the scan follow the input."""
        if not self.needs_draw():
            return
        info, r = self.state.info, self.state.result
        if info is None or r is None:
            return
        if info.encoder_decoder:
            self.effect_text.setText("")
            self.stack.show_message(f"Switching heads off is not supported yet for encoder-decoders such as "
                                    f"{info.name}: pick an encoder, a decoder or an image model.")
            self.run_button.setEnabled(False)
            return
        self.run_button.setEnabled(not self.state.job_busy(SCAN_LANE))
        self.stack.show_canvas()
        self._draw_switches()
        if self._scan_for is not None and self._scan_for[0] != self._input_key():
            self._drop_scan("The input changed since the scan: run it again.")
        if self._compared_for is None or self._compared_for[0] != self._input_key():
            self._request_compare()

    # --------------------------------------------------------------------------- switching heads off
    def toggle(self, layer: int, head: int) -> None:
        """Switch a head off, or on again, and measure the effect."""
        key = (int(layer), int(head))
        self.off.symmetric_difference_update({key})
        self._draw_switches()
        self._request_compare()

    def clear_heads(self) -> None:
        self.off.clear()
        self._draw_switches()
        self._request_compare()

    def _ablate(self) -> dict:
        how = self.how.currentData()
        return {k: how for k in sorted(self.off)}

    def _request_compare(self) -> None:
        if self.state.info is None or self.state.result is None:
            return
        x, kw = self.state.run_input()
        key = (self._input_key(), frozenset(self.off), self.how.currentData())
        self.effect_text.setText("Measuring…" if self.off else "")
        ok = self.state.submit(compare_job, x, dict(kw), self._ablate(), TOP_TOKENS, key=COMPARE_LANE,
                               on_result=lambda c: self._compared(key, c), on_error=self._compare_failed)
        if not ok:
            self.effect_text.setText("")

    def _compared(self, key, c) -> None:
        if key != (self._input_key(), frozenset(self.off), self.how.currentData()):
            return  # the heads or the input changed meanwhile; the newer request answers
        self.comparison, self._compared_for = c, key
        self._draw_effect()
        self.compared.emit()

    def _compare_failed(self, message: str) -> None:
        self.effect_text.setText("")
        self.state.error_raised.emit(message)

    def _draw_switches(self) -> None:
        info = self.state.info
        L, H = info.num_layers, info.num_heads
        grid = np.zeros((L, H), dtype=np.float32)
        for l, h in self.off:
            grid[l, h] = 1.0
        self.switch_image.setImage(grid, levels=(0, 1), lut=OFF_COLOURS.getLookupTable(0, 1, 2))
        self.switch_image.setRect(0, 0, H, L)
        _label_cells(self.switch_plot, L, H)
        self.switch_plot.setRange(xRange=(0, H), yRange=(0, L), padding=0)
        names = ", ".join(f"L{l} H{h}" for l, h in sorted(self.off)[:6]) + (" …" if len(self.off) > 6 else "")
        self.off_label.setText(f"{len(self.off)} off: {names}" if self.off else "none off: click heads in the grid")

    def _draw_effect(self) -> None:
        c = self.comparison
        off = f"{c.heads} head{'s' * (c.heads != 1)} off ({self.how.currentText()})"
        if c.kind == "similarity":
            labels, before, after = ["similarity"], np.ones(1), np.asarray([c.similarity])
            text = f"{off}: {c.metric} with the clean run = <b>{c.similarity:.4f}</b> (1: unchanged)."
            ylabel = "cosine"
        else:
            labels, before, after = list(c.labels), np.asarray(c.before), np.asarray(c.after)
            b, a = int(np.argmax(before)), int(np.argmax(after))
            name = token_text if c.kind == "decoder" else str
            text = (f"{off}: top {'next token' if c.kind == 'decoder' else 'class'} "
                    f"<b>{name(labels[b])}</b> {before[b]:.3f} → <b>{name(labels[a])}</b> {after[a]:.3f} (clean grey, "
                    f"heads off orange).")
            ylabel = c.metric
        if not c.heads:
            text = "All heads on: the bars show the clean run. Click heads in the grid to switch them off."
        n = len(labels)
        y = np.arange(n) + 0.5
        self.before_bars.setOpts(x0=np.zeros(n), y=y - 0.2, height=0.38, width=before)
        self.after_bars.setOpts(x0=np.zeros(n), y=y + 0.2, height=0.38, width=after)
        shown = [token_text(t) for t in labels] if c.kind == "decoder" else labels
        self.bar_axis.set_labels(shown)
        if c.kind != "similarity":  # the targets to pick from: the bars' tokens or classes, most likely first
            order = [int(i) for i in np.argsort(-before, kind="stable")]
            for box in (self.target, self.foil):
                box.set_tokens([labels[i] for i in order], None if c.kind == "decoder" else [labels[i] for i in order])
        top = float(max(before.max(initial=0), after.max(initial=0), 1e-6))
        self.bars_plot.setRange(xRange=(0, top * 1.05), yRange=(0, n), padding=0)
        # no title: its line is the room the bars' labels need at 1024×700; the colours are named below them
        self.bars_plot.setLabel("bottom", f"{ylabel}: clean grey, heads off orange")
        self.effect_text.setText(text)

    def _switch_clicked(self, ev) -> None:
        info = self.state.info
        if info is None or ev.button() != Qt.LeftButton:
            return
        hit = cell_under(self.switch_plot, ev.scenePos(), (info.num_layers, info.num_heads))
        if hit is not None:
            self.toggle(*hit)

    def switch_centre(self, layer: int, head: int):
        """Scene position of a head's cell in the switch grid (tests click here)."""
        return cell_centre(self.switch_plot, layer, head)

    # --------------------------------------------------------------------------- scans
    def run_scan(self) -> bool:
        """Start the chosen scan on the current input; False when there is nothing to scan."""
        if self.state.info is None or self.state.result is None:
            return False
        x, kw = self.state.run_input()
        kind = self.scan_kind.currentData()
        target = self.target.text() or None
        foil = self.foil.text() or None
        key = (self._input_key(), kind, self.corrupt.text())
        if kind == "ablation":
            args = (ablation_job, x, dict(kw), self.how.currentData(), target, foil)
        else:
            if not self.corrupt.text().strip():
                self.state.error_raised.emit("patching needs a corrupt text: type one with as many tokens as the input")
                return False
            args = (patching_job, x, self.corrupt.text(), dict(kw), "head" if kind == "patch-head" else "position",
                    target, foil)
        self.progress.setValue(0)
        self.progress.show()
        self.cancel_button.show()
        self.run_button.setEnabled(False)
        self.scan_text.setText(f"{SCANS[kind][1]}…")
        return self.state.submit(*args, key=SCAN_LANE, on_result=lambda s: self._scanned(key, s),
                                 on_error=self._scan_failed, on_progress=self._scan_progressed)

    def _scan_progressed(self, fraction: float, message: str) -> None:
        if self.progress.isVisible():
            self.progress.setValue(int(round(fraction * 1000)))
            self.progress.setToolTip(message)

    def _end_scan(self) -> None:
        self.cancel_button.hide()
        self.progress.hide()
        self.run_button.setEnabled(True)

    def cancel_scan(self, quiet: bool = False) -> None:
        running = self.state.job_busy(SCAN_LANE)
        self.state.cancel(SCAN_LANE)
        self._end_scan()
        if running and not quiet:
            self.scan_text.setText("Scan cancelled: nothing was measured. Run it again to see every cell.")
            self.scan_finished.emit(False)

    def _scan_failed(self, message: str) -> None:
        self._end_scan()
        self.scan_text.setText("")
        self.state.error_raised.emit(message)
        self.scan_finished.emit(False)

    def _scanned(self, key, scan) -> None:
        self.progress.setValue(1000)
        self._end_scan()
        if key[0] != self._input_key():
            self._drop_scan("The input changed during the scan: run it again.")
            self.scan_finished.emit(False)
            return
        self.scan, self._scan_for = scan, key
        self._draw_scan()
        self.scan_finished.emit(True)

    def _drop_scan(self, why: str) -> None:
        self.scan = self._scan_for = None
        self.scan_stack.show_message(why or "Run a scan to see every head's effect here.")
        self.table.setRowCount(0)
        self.table.setHorizontalHeaderLabels(["#", "L", "H", "effect"])  # a per-position scan's "pos" goes too
        self.scan_plot.setTitle("")
        self.scan_text.setText(why)

    def _draw_scan(self) -> None:
        s = self.scan
        e = np.nan_to_num(np.asarray(s.effect, dtype=np.float64))
        rows, cols = e.shape
        v = float(np.abs(e).max()) or 1e-6
        self.scan_image.setImage(e.astype(np.float32), levels=(-v, v), autoLevels=False)
        self.scan_image.setRect(0, 0, cols, rows)
        per_position = s.kind == "patch-position"
        _label_cells(self.scan_plot, rows, cols, [token_text(t, 8) for t in s.tokens] if per_position else None)
        self.scan_plot.setRange(xRange=(0, cols), yRange=(0, rows), padding=0)
        self.scan_plot.setTitle(SCANS[s.kind][0])
        self.scan_stack.show_canvas()
        self._fill_table(per_position)
        best = s.ranked(1)[0]
        where = f"L{best[0]} @{best[1]} {s.tokens[best[1]]!r}" if per_position else f"L{best[0]} H{best[1]}"
        base = f"clean {s.clean:.4f}" + ("" if s.corrupt is None else f", corrupt {s.corrupt:.4f}")
        self.scan_text.setText(f"<b>{s.metric}</b>: {base}. Colour and table: {s.effect_label} (red above 0, blue "
                               f"below, ±{v:.3g} at full colour); the largest: <b>{where}</b> ({best[2]:+.3f}). "
                               f"{s.passes} forward pass{'es' * (s.passes != 1)}.")

    def _fill_table(self, per_position: bool) -> None:
        s = self.scan
        self.table.setSortingEnabled(False)
        self.table.setHorizontalHeaderLabels(["#", "L", "pos" if per_position else "H", "effect"])
        ranked = s.ranked(TOP_ROWS)
        self.table.setRowCount(len(ranked))
        for i, (row, col, effect) in enumerate(ranked):
            for j, value in enumerate((i + 1, row, col, effect)):
                item = QTableWidgetItem()
                item.setData(Qt.DisplayRole, round(value, 4) if j == 3 else int(value))
                if j == 2 and per_position:
                    item.setToolTip(s.tokens[col])
                self.table.setItem(i, j, item)
        self.table.setSortingEnabled(True)
        self.table.sortItems(0, Qt.AscendingOrder)  # the largest |effect| first; any column sorts on a click

    def table_cells(self) -> list[tuple[int, int, float]]:
        """(layer, head or position, effect) of the table's rows, top to bottom as shown."""
        t = self.table
        return [(int(t.item(i, 1).data(Qt.DisplayRole)), int(t.item(i, 2).data(Qt.DisplayRole)),
                 float(t.item(i, 3).data(Qt.DisplayRole))) for i in range(t.rowCount())]

    def _row_clicked(self, row: int, _col: int) -> None:
        layer, col, _ = self.table_cells()[row]
        self.open_cell(layer, col)

    def _scan_clicked(self, ev) -> None:
        if self.scan is None or ev.button() != Qt.LeftButton:
            return
        hit = cell_under(self.scan_plot, ev.scenePos(), np.shape(self.scan.values))
        if hit is not None:
            self.open_cell(*hit)

    def scan_centre(self, row: int, col: int):
        """Scene position of a result cell (tests click here)."""
        return cell_centre(self.scan_plot, row, col)

    def open_cell(self, layer: int, col: int) -> None:
        """Open a result cell's head in the One-head view; a position cell opens the layer's selected head
        with that position as the query."""
        if self.scan is not None and self.scan.kind == "patch-position":
            self.state.set_query(int(col))
            head = self.state.head
        else:
            head = int(col)
        self.state.select(int(layer), head)
        self.head_opened.emit(int(layer), head)


class _Splitter(QSplitter):
    """The page's plots: they take the room there is. Their canvases ask for 600×480 each, and the window's
    scroll area sizes a page by what it asks for, so at 1024×700 the scan went below the fold."""

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt API
        return QSize(420, 320)


def _label_cells(plot: pg.PlotItem, rows: int, cols: int, col_labels: list[str] | None = None) -> None:
    """Layer numbers down and head numbers (or tokens) across, as many as fit."""
    for side, labels in (("left", [str(i) for i in range(rows)]),
                         ("bottom", col_labels or [str(j) for j in range(cols)])):
        axis = plot.getAxis(side)
        if axis._labels != labels:
            axis.set_labels(labels)
