"""The side panels: the input (text or image) and the d_k slider (the n slider is in seq_panel.py).

Each panel gets the session state, forwards what the user does, and redraws from its signals.
"""
from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton,
                               QSlider, QVBoxLayout, QWidget)
from superqt.utils import signals_blocked

from attn_explorer.gui.widgets.heatmap import follow_loading
from attn_explorer.gui.widgets.stats import head_entropy_and_peak
from attn_explorer.session import mixers
from attn_explorer.session.stacks import STACK_NAMES, STACKS
from attn_explorer.session.state import DK_MAX, DK_MIN, SessionState, sample_images

DEBOUNCE_MS = 100
DK_STEPS = 1000  # slider ticks; the middle one is exactly 1×


def dk_from_slider(v: int) -> float:
    """Slider position -> scale, logarithmic from DK_MIN to DK_MAX (0.05× .. 20×, 1× in the middle)."""
    return float(DK_MIN * (DK_MAX / DK_MIN) ** (v / DK_STEPS))


def slider_from_dk(scale: float) -> int:
    return int(round(DK_STEPS * math.log(scale / DK_MIN) / math.log(DK_MAX / DK_MIN)))


def deferred(owner: QObject, slot: Callable[[], None]) -> Callable[..., None]:
    """A coalescing, zero-delay call of `slot()`. Qt paints pending updates before it runs zero-time
    timers, so the page the user watches paints a new result first and the side panels follow."""
    timer = QTimer(owner)
    timer.setSingleShot(True)
    timer.setInterval(0)
    timer.timeout.connect(slot)
    return lambda *_: timer.start()


EMPTY_INPUT = "No input: type some text (or open an image) to see its attention."


def token_counts(r, hide_special: bool) -> str:
    """'16 tokens shown (2 special hidden)', or '18 tokens': the count the maps show."""
    special = int(np.count_nonzero(r.special)) if r.special is not None else 0
    if hide_special and special:
        return f"{r.num_tokens - special:,} tokens shown ({special} special hidden)"
    return f"{r.num_tokens:,} tokens"


TARGET_HINT = "Empty: the decoder reads the source text (as BART does with no target)."
STACK_LABELS = {"encoder": "Encoder", "decoder": "Decoder", "cross": "Cross-attention"}


class StackSwitch(QWidget):
    """"Show: Encoder | Decoder | Cross-attention" for an encoder-decoder (BART): which maps the explorer
    pages draw (the session's `stack` view option: the grid is pooled again, nothing runs again). Hidden
    for every other model, which has only its one stack."""

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.combo = QComboBox()
        for key in STACKS:
            self.combo.addItem(STACK_LABELS[key], key)
            self.combo.setItemData(self.combo.count() - 1, STACK_NAMES[key], Qt.ToolTipRole)
        self.combo.setToolTip("Which attention of the encoder-decoder to draw: the encoder's (source → source), "
                              "the decoder's (target → earlier target) or cross-attention (target → source)")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(QLabel("Show:"))
        lay.addWidget(self.combo)
        self.combo.activated.connect(lambda i: state.set_options(stack=self.combo.itemData(i)))
        state.options_changed.connect(self._follow)
        state.model_loaded.connect(self._follow)
        self._follow()

    def _follow(self, *_) -> None:
        info = self.state.info
        self.setVisible(info is not None and info.encoder_decoder)
        with signals_blocked(self.combo):
            self.combo.setCurrentIndex(STACKS.index(self.state.stack))


def titled_page(page: QWidget, title: QWidget, switch: StackSwitch) -> QVBoxLayout:
    """The page's layout with its title and, top right, the stack switch in one row (grid and head pages)."""
    lay = QVBoxLayout(page)
    lay.setContentsMargins(4, 4, 4, 4)
    head = QHBoxLayout()
    head.addWidget(title, 1)
    head.addWidget(switch, 0, Qt.AlignTop)
    lay.addLayout(head)
    return lay


class InputPanel(QGroupBox):
    """Text box (live, debounced) and image choices. The text lives in the session: the box sends what is
    typed (`set_text`) and follows `text_changed`, so a lesson's button or a file opened shows here."""

    open_image_requested = Signal()

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__("Input", parent)
        self.state = state
        self.text = QPlainTextEdit(state.text)
        self.text.setPlaceholderText("Type a sentence: the maps update as you type.")
        self.text.setMaximumHeight(110)
        self.debounce = QTimer(self)
        self.debounce.setSingleShot(True)
        self.debounce.setInterval(DEBOUNCE_MS)
        self.open_image = QPushButton("Open image…")
        self.samples = QComboBox()
        self.samples.addItem("Sample images…", None)
        for p in sample_images():
            self.samples.addItem(p.stem, str(p))
        self.current = QLabel("")
        self.current.setWordWrap(True)
        self.current.setStyleSheet("color: #555;")
        # encoder-decoders (BART): the decoder's text, shown only for such a model
        self.target_label = QLabel("Target text (the decoder's, live):")
        self.target = QPlainTextEdit(state.target)
        self.target.setPlaceholderText(TARGET_HINT)
        self.target.setToolTip("The text the decoder writes: its maps and cross-attention to the source "
                               "come from it. " + TARGET_HINT)
        self.target.setMaximumHeight(70)
        self.target_debounce = QTimer(self)
        self.target_debounce.setSingleShot(True)
        self.target_debounce.setInterval(DEBOUNCE_MS)

        row = QHBoxLayout()
        row.addWidget(self.open_image)
        row.addWidget(self.samples, 1)
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("Text (live):"))
        lay.addWidget(self.text)
        lay.addWidget(self.target_label)
        lay.addWidget(self.target)
        lay.addWidget(QLabel("Image (open, drop onto the window, or a sample):"))
        lay.addLayout(row)
        lay.addWidget(self.current)

        self.text.textChanged.connect(self.debounce.start)
        self.debounce.timeout.connect(self._send_text)
        self.open_image.clicked.connect(self.open_image_requested)
        self.samples.activated.connect(self._sample_chosen)
        describe = deferred(self, self._describe)
        state.attention_ready.connect(describe)
        state.options_changed.connect(describe)  # hide specials changes the count shown
        state.input_cleared.connect(describe)
        state.model_loaded.connect(describe)  # an empty input at start says so once the model is there
        state.text_changed.connect(self._follow_text)
        self.target.textChanged.connect(self.target_debounce.start)
        self.target_debounce.timeout.connect(lambda: self.state.set_target(self.target.toPlainText()))
        state.target_changed.connect(self._follow_target)
        state.model_loaded.connect(self._show_target)
        self._show_target()

    def _show_target(self, *_) -> None:
        info = self.state.info
        seq2seq = info is not None and info.encoder_decoder
        self.target_label.setVisible(seq2seq)
        self.target.setVisible(seq2seq)

    def _follow_target(self, text: str) -> None:
        if text == self.target.toPlainText():
            return
        self.target_debounce.stop()
        with signals_blocked(self.target):
            self.target.setPlainText(text)

    def _send_text(self) -> None:
        self.state.set_text(self.text.toPlainText())

    def _follow_text(self, text: str) -> None:
        """The session's text changed: show it, unless it came from this box (then the box has it, and its
        cursor stays where the user is typing)."""
        if text == self.text.toPlainText():
            return
        self.debounce.stop()  # an edit not yet sent is replaced, not sent after
        with signals_blocked(self.text):
            self.text.setPlainText(text)

    def _sample_chosen(self, index: int) -> None:
        path = self.samples.itemData(index)
        if path:
            self.state.set_image(path)

    def _describe(self) -> None:
        """Say what is on screen, and let the sample picker name it (or no sample at all)."""
        r = self.state.result
        if r is None:
            if not self.state.has_input:
                self.current.setText(EMPTY_INPUT)
                self.samples.setCurrentIndex(0)
            return
        shown = None
        if getattr(r, "image_token_positions", None) is not None:  # a vision-language run (issue 26 B)
            src = self.state.image
            shown = str(Path(src).resolve()) if isinstance(src, str) else None
            self.current.setText(vlm_counts(r, src))
        elif r.grid is not None:
            src = self.state.image
            name = Path(src).name if isinstance(src, str) else "image"
            shown = str(Path(src).resolve()) if isinstance(src, str) else None
            self.current.setText(f"Showing image {name}: {r.image.shape[1]}×{r.image.shape[0]} px, "
                                 f"{r.grid[0]}×{r.grid[1]} patches.")
        else:
            cut = ""
            if r.total_tokens and r.num_tokens < r.total_tokens:
                why = f": {self.state.cut_reason}" if self.state.cut_reason else ""
                cut = f" (cut to the first {r.num_tokens:,} of {r.total_tokens:,}{why})"
            dec = ""
            if r.decoder_attentions is not None:
                dec = (f" Decoder: {len(r.decoder_tokens)} target tokens (the start token first)."
                       if self.state.target.strip() else " Decoder: no target, it reads the source.")
            note = f" {self.state.text_note}." if self.state.text_note else ""  # a long file cut on its way in
            self.current.setText(f"Showing text: {token_counts(r, self.state.hide_special)}{cut}.{dec}{note}")
        index = next((i for i in range(1, self.samples.count())
                      if shown is not None and str(Path(self.samples.itemData(i)).resolve()) == shown), 0)
        self.samples.setCurrentIndex(index)


class DkPanel(QGroupBox):
    """Scale 1/sqrt(d_k) live and watch the softmax flatten (low) or saturate (high)."""

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__("Scale 1/√d_k", parent)
        self.state = state
        self.slider = QSlider(Qt.Horizontal)
        self.slider.setRange(0, DK_STEPS)
        self.slider.setValue(slider_from_dk(state.dk_scale))
        self.value = QLabel()
        self.value.setMinimumWidth(60)
        self.reset = QPushButton("1×")
        self.reset.setMaximumWidth(40)
        self.layer_only = QCheckBox("only the selected layer")
        self.readout = QLabel("")
        self.readout.setWordWrap(True)
        self.plot = pg.PlotWidget()
        self.plot.setFixedHeight(110)
        self.plot.hide()  # until the first result: empty axes would only show made-up ranges
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setLabel("left", "bits")
        self.plot.setLabel("bottom", "head")
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush="#4c78a8")
        self.sel_bar = pg.BarGraphItem(x=[], height=[], width=0.7, brush="#ff3b30")
        self._ticked_heads = 0  # head count the x ticks were made for
        self.max_line = pg.InfiniteLine(angle=0, pen=pg.mkPen("#888", style=Qt.DashLine))
        for it in (self.bars, self.sel_bar, self.max_line):
            self.plot.addItem(it)
        self.entropy: np.ndarray | None = None  # (H,) mean row entropy of the selected layer
        self.peak: np.ndarray | None = None

        row = QHBoxLayout()
        row.addWidget(QLabel("0.05×"))
        row.addWidget(self.slider, 1)
        row.addWidget(QLabel("20×"))
        row.addWidget(self.value)
        row.addWidget(self.reset)
        lay = QVBoxLayout(self)
        lay.addLayout(row)
        lay.addWidget(self.layer_only)
        lay.addWidget(self.readout)
        lay.addWidget(self.plot)
        self._show_value()

        self.slider.valueChanged.connect(self._moved)
        self.reset.clicked.connect(lambda: self.slider.setValue(slider_from_dk(1.0)))
        self.layer_only.toggled.connect(state.set_dk_layer_only)
        state.attention_ready.connect(deferred(self, self.refresh))
        state.selection_changed.connect(lambda *_: self.refresh())
        state.options_changed.connect(deferred(self, self.refresh))  # the stack shown may have changed
        state.model_loaded.connect(lambda *_: self._show_value())
        state.input_cleared.connect(self.plot.hide)  # its bars described the maps that went
        follow_loading(state, self.readout.setText)

    def _show_value(self) -> None:
        self.value.setText(f"{self.state.dk_scale:.2f}×")
        self.layer_only.setText(f"only layer {self.state.layer}" if self.state.info else "only the selected layer")

    def _moved(self, v: int) -> None:
        self.state.set_dk_scale(dk_from_slider(v))
        self._show_value()

    def refresh(self, *_):
        r = self.state.result
        self._show_value()
        if r is None:
            return
        st = self.state
        maps = st.maps(r)  # the stack the pages show (an encoder-decoder's decoder or cross-attention too)
        L, H, _, N = maps.attentions.shape
        if st.layer >= L or st.head >= H:
            return  # the selection is moving to the stack shown; its selection_changed comes next
        if getattr(r, "is_lazy", False):  # n² work per head: the Analyses' overview computes it in tiles
            self.plot.hide()
            self.entropy = self.peak = None
            self.readout.setText(f"{N:,} tokens: the maps are computed from q and k when a view asks, so this "
                                 "panel's per-head entropy is not drawn (the Analyses compute head statistics "
                                 "in tiles). The slider still rescales every map.")
            return
        if maps.stack == "encoder" and mixers.is_recurrent(st.info, st.layer):  # a hybrid's recurrent layer
            self.plot.hide()
            self.entropy = self.peak = None
            self.readout.setText(f"Layer {st.layer} ({html.escape(mixers.mixer_label(st.info, st.layer))}): "
                                 f"{mixers.NOT_PROBABILITIES}. It has no softmax, so this slider does not reach "
                                 "it (it scales the softmax layers' scores only).")
            return
        self.plot.show()
        self.entropy, self.peak = head_entropy_and_peak(maps.attentions[st.layer])
        e, m = float(self.entropy[st.head]), float(self.peak[st.head])
        top = math.log2(N) if N > 1 else 0.0
        where = (f"{STACK_LABELS[maps.stack]}, layer" if r.decoder_attentions is not None else "Layer")
        self.readout.setText(
            f"{where} {st.layer}, head {st.head}: mean row entropy <b>{e:.2f} bits</b> "
            f"(uniform = {top:.2f}), mean max weight <b>{m:.2f}</b>. "
            f"Layer mean: {self.entropy.mean():.2f} bits, max {self.peak.mean():.2f}. "
            "Lower scale → flatter rows (more bits); higher → one key wins.")
        x = np.arange(H)
        self.bars.setOpts(x=x, height=self.entropy)
        self.sel_bar.setOpts(x=[st.head], height=[self.entropy[st.head]])
        self.max_line.setPos(top)
        self.plot.setXRange(-0.6, H - 0.4, padding=0)
        self.plot.setYRange(0, max(top, 0.1) * 1.05, padding=0)
        if self._ticked_heads != H:  # heads are whole numbers: no 0.5 ticks
            step = max(1, math.ceil(H / 12))
            self.plot.getAxis("bottom").setTicks([[(i, str(i)) for i in range(0, H, step)], []])
            self._ticked_heads = H


def vlm_counts(r, src) -> str:
    """Which tokens of a vision-language run are the picture's: "16 image tokens (4×4 patches) + 25 text tokens"."""
    n_img = len(r.image_token_positions)
    name = Path(src).name if isinstance(src, str) else "image"
    tiles = getattr(r, "image_tiles", None)
    where = f", {tiles[0]}×{tiles[1]} tiles and a global view" if tiles else ""
    from attn_explorer.gui.explorer.vlm_overlay import patch_grid

    rows, cols = patch_grid(r)
    grid = f" ({rows}×{cols} patches{where})"
    first, last = int(r.image_token_positions[:, 0].min()), int(r.image_token_positions[:, 0].max())
    return (f"Showing {name} and the prompt: {n_img:,} image tokens{grid} + {r.num_tokens - n_img:,} text tokens "
            f"(the image is tokens {first}–{last}).")
