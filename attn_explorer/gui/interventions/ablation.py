"""The switch-heads-off page: click heads in an L×H grid to switch them off (zero or mean) and see the effect at
once; run an ablation scan or an activation-patching experiment, with progress and Cancel; click a result
cell to open that head.

The effect is drawn in the form that fits the model: a decoder's next-token probabilities before and after,
a classifier's class probabilities, an encoder's sentence-embedding similarity with the clean run. The page
asks its `session.interventions.InterventionSession` and draws its answers (switches.py: the grid of heads
and the bars; scan_view.py: a scan's grid and table) in the shared frame (widgets.page.PageFrame).
"""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSplitter, QWidget

from attn_explorer.gui.interventions.scan_view import ScanResults
from attn_explorer.gui.interventions.switches import EffectBars, HeadSwitches
from attn_explorer.gui.widgets.page import PageFrame
from attn_explorer.gui.widgets.tokens import TokenPicker
from attn_explorer.session.interventions import NO_CORRUPT, SCANS, InterventionSession

TOP_TOKENS = 6  # bars: the most likely next tokens of either run (up to twice as many in all)
CAPTION = ("<b>Switch heads off</b> by clicking them in the left grid: their output before W_O becomes zero, or its "
           "mean over this input's positions; the bars compare the clean run (grey) with heads off (orange). A "
           "<b>scan</b> switches off, or patches, one cell at a time; click a result to open its head.")


class AblationPage(PageFrame):
    scan_finished = Signal(bool)  # True: a scan's result is on screen; False: cancelled or failed
    compared = Signal()  # the effect of the heads switched off is on screen

    def __init__(self, session: InterventionSession, parent: QWidget | None = None):
        self.session = session
        self.switches = HeadSwitches()
        self.effect_bars = EffectBars()
        self.results = ScanResults()
        right = QSplitter(Qt.Vertical)
        right.addWidget(self.effect_bars)
        right.addWidget(self.results)
        right.setSizes([250, 250])
        split = _Splitter(Qt.Horizontal)
        split.addWidget(self.switches)
        split.addWidget(right)
        split.setSizes([180, 620])
        super().__init__(session.state, split, parent, message="Load a model to switch its heads off.", rich=True,
                         mono_readout=False)
        self.off: set[tuple[int, int]] = set()  # heads switched off
        self.comparison = None  # session Comparison on screen
        self._compared_for = None  # (input key, heads off, how) of `comparison`
        self._scan_for = None  # input key the scan on screen belongs to
        self.caption.setText(CAPTION)
        self._build_controls()
        self.switches.toggled.connect(self.toggle)
        self.results.cell_opened.connect(self.open_cell)
        session.compared.connect(self._compared)
        session.scan_progressed.connect(lambda f, m: self.progress.advance(f, m))
        session.scanned.connect(self._scanned)
        session.scan_dropped.connect(self._scan_dropped)
        session.failed.connect(self._job_failed)
        state = session.state
        state.attention_ready.connect(lambda *_: self.refresh())
        state.model_loaded.connect(self._model_changed)
        state.input_cleared.connect(self._cleared)
        self._kind_changed()

    @property
    def scan(self):
        """The Scan on screen, or None."""
        return self.results.scan

    def _build_controls(self) -> None:
        self.how = QComboBox()
        self.how.addItem("set to zero", "zero")
        self.how.addItem("set to its mean", "mean")
        self.how.setToolTip("What a head switched off outputs: zero, or its mean output over this input's positions")
        self.how.currentIndexChanged.connect(lambda *_: self._request_compare())
        self.clear_button = QPushButton("All heads on")
        self.clear_button.clicked.connect(self.clear_heads)
        self.off_label = QLabel("")
        self.off_label.setWordWrap(True)
        for w in (QLabel("Heads off:"), self.how, self.clear_button):
            self.control_row.addWidget(w)
        self.control_row.addWidget(self.off_label, 1)
        self.effect_text = QLabel("")
        self.effect_text.setWordWrap(True)
        self.effect_text.setTextFormat(Qt.RichText)
        self.add_row(self.effect_text)

        self.scan_kind = QComboBox()
        for key, (text, title) in SCANS.items():
            self.scan_kind.addItem(text, key)
            self.scan_kind.setItemData(self.scan_kind.count() - 1, title, Qt.ToolTipRole)
        self.scan_kind.currentIndexChanged.connect(self._kind_changed)
        self.scan_kind.setMaximumWidth(190)
        self.target = TokenPicker()  # the bars' tokens to pick from, so the target is the exact token measured
        self.target.setPlaceholderText("target (top token)")
        self.target.setToolTip("Decoders: the next token to measure; pick one of the bars' tokens or type one, its "
                               "leading space as ␣ (␣Mary is ' Mary', Mary another token); empty: the clean run's "
                               "most likely token. Classifiers: the class (empty: the top one)")
        self.foil = TokenPicker()
        self.foil.setPlaceholderText("foil (optional)")
        self.foil.setToolTip("Decoders: measure logit(target) − logit(foil) instead of log p(target); ␣ is a "
                             "leading space")
        for box in (self.target, self.foil):
            box.setMaximumWidth(130)
        self.corrupt = QLineEdit()
        self.corrupt.setPlaceholderText("corrupt text, as many tokens")
        self.corrupt.setToolTip("Patching: the clean text is the input; this is the corrupt one, with the same number "
                                "of tokens (e.g. the two names swapped)")
        self.corrupt.setMaximumWidth(520)
        self.run_button = QPushButton("Run scan")
        self.run_button.clicked.connect(self.run_scan)
        row = QHBoxLayout()
        for w in (self.scan_kind, self.target, self.foil):
            row.addWidget(w)
        row.addWidget(self.corrupt, 1)
        row.addWidget(self.run_button)
        row.addStretch(0)
        self.add_row(row)

    # --------------------------------------------------------------------------- state
    def _model_changed(self, info) -> None:
        self.session.cancel_compare()
        self.cancel_scan(quiet=True)
        self.off.clear()
        self.comparison = self._compared_for = None
        self._drop_scan("")
        self.target.clear()
        self.foil.clear()
        image = info.modality in ("image", "image-text")  # a vision-language model: api.vlm refuses patching
        for i in (1, 2):  # patching takes a second text: text models only
            self.scan_kind.model().item(i).setEnabled(not image)
        if image:
            self.scan_kind.setCurrentIndex(0)
        self.refresh()

    def _cleared(self) -> None:
        self.session.cancel_compare()
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
        if not self.needs_draw() or not self.session.ready:
            return
        info = self.session.info
        if info.encoder_decoder:
            self.effect_text.setText("")
            self.stack.show_message(f"Switching heads off is not supported yet for encoder-decoders such as "
                                    f"{info.name}: pick an encoder, a decoder or an image model.")
            self.run_button.setEnabled(False)
            return
        self.run_button.setEnabled(not self.session.scanning)
        self.stack.show_canvas()
        self._draw_switches()
        key = self.session.input_key()
        if self._scan_for is not None and self._scan_for != key:
            self._drop_scan("The input changed since the scan: run it again.")
        if self._compared_for is None or self._compared_for[0] != key:
            self._request_compare()

    # --------------------------------------------------------------------------- switching heads off
    def toggle(self, layer: int, head: int) -> None:
        """Switch a head off, or on again, and measure the effect."""
        self.off.symmetric_difference_update({(int(layer), int(head))})
        self._draw_switches()
        self._request_compare()

    def clear_heads(self) -> None:
        self.off.clear()
        self._draw_switches()
        self._request_compare()

    def _request_compare(self) -> None:
        self.effect_text.setText("Measuring…" if self.off else "")
        if not self.session.compare(self.off, self.how.currentData(), TOP_TOKENS):
            self.effect_text.setText("")

    def _compared(self, c) -> None:
        how = self.how.currentData()
        if not self.session.is_current(self.off, how):
            return  # the heads changed meanwhile; the newer request answers
        self.comparison, self._compared_for = c, (self.session.input_key(), frozenset(self.off), how)
        self.effect_text.setText(self.effect_bars.draw(c, self.how.currentText()))
        if c.kind != "similarity":  # the targets to pick from: the bars' tokens or classes, most likely first
            order = sorted(range(len(c.labels)), key=lambda i: -float(c.before[i]))
            labels = [c.labels[i] for i in order]
            for box in (self.target, self.foil):
                box.set_tokens(labels, None if c.kind == "decoder" else labels)
        self.compared.emit()

    def _job_failed(self, what: str, message: str) -> None:
        if what == "compare":
            self.effect_text.setText("")
        else:
            self._end_scan()
            self.readout.setText("")
            self.scan_finished.emit(False)
        self.failed.emit(message)

    def _draw_switches(self) -> None:
        info = self.session.info
        self.switches.draw(info.num_layers, info.num_heads, self.off, tuple(getattr(info, "layer_heads", ()) or ()))
        names = ", ".join(f"L{l} H{h}" for l, h in sorted(self.off)[:6]) + (" …" if len(self.off) > 6 else "")
        self.off_label.setText(f"{len(self.off)} off: {names}" if self.off else "none off: click heads in the grid")

    def switch_centre(self, layer: int, head: int):
        """Scene position of a head's cell in the switch grid (tests click here)."""
        return self.switches.centre(layer, head)

    # --------------------------------------------------------------------------- scans
    def run_scan(self) -> bool:
        """Start the chosen scan on the current input; False when there is nothing to scan."""
        if not self.session.ready:
            return False
        kind = self.scan_kind.currentData()
        target, foil = self.target.text() or None, self.foil.text() or None
        if kind != "ablation" and not self.corrupt.text().strip():
            self.failed.emit(NO_CORRUPT)  # the banner says what is missing; the last scan stays
            return False
        self.progress.start("", "%p%")
        self.run_button.setEnabled(False)
        self.readout.setText(f"{SCANS[kind][1]}…")
        self._scan_for = None
        if kind == "ablation":
            return self.session.scan(kind, self.how.currentData(), target, foil)
        per = "head" if kind == "patch-head" else "position"
        return self.session.patch(self.corrupt.text(), per, target, foil)

    def _end_scan(self) -> None:
        self.progress.finish()
        self.run_button.setEnabled(True)

    def cancel(self) -> None:
        """The progress line's Cancel."""
        self.cancel_scan()

    def cancel_scan(self, quiet: bool = False) -> None:
        self.session.cancel_scan(quiet)
        self._end_scan()

    def _scan_dropped(self, why: str) -> None:
        self._end_scan()
        if why == "cancelled":
            self.readout.setText("Scan cancelled: nothing was measured. Run it again to see every cell.")
        else:
            self._drop_scan("The input changed during the scan: run it again.")
        self.scan_finished.emit(False)

    def _scanned(self, scan) -> None:
        self.progress.advance(1.0)
        self._end_scan()
        self._scan_for = self.session.input_key()
        self.readout.setText(self.results.draw(scan))
        self.scan_finished.emit(True)

    def _drop_scan(self, why: str) -> None:
        self._scan_for = None
        self.results.drop(why)
        self.readout.setText(why)

    def table_cells(self) -> list[tuple[int, int, float]]:
        """(layer, head or position, effect) of the scan table's rows, top to bottom as shown."""
        return self.results.table_cells()

    def scan_centre(self, row: int, col: int):
        """Scene position of a result cell (tests click here)."""
        return self.results.centre(row, col)

    def open_cell(self, layer: int, col: int) -> None:
        """Open a result cell's head in the One-head view; a position cell opens the layer's selected head
        with that position as the query."""
        if self.scan is not None and self.scan.kind == "patch-position":
            self.state.set_query(int(col))
            head = self.state.head
        else:
            head = int(col)
        self.open_head(int(layer), head)


class _Splitter(QSplitter):
    """The page's plots: they take the room there is. Their canvases ask for 600×480 each, and the window's
    scroll area sizes a page by what it asks for, so at 1024×700 the scan went below the fold."""

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt API
        return QSize(420, 320)
