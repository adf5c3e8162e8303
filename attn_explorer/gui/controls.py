"""The side panels: the input (text or image), the d_k slider and the sequence-length slider.

Each panel gets the session state, forwards what the user does, and redraws from its signals.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit,
                               QProgressBar, QPushButton, QSlider, QVBoxLayout, QWidget)

from attn_explorer.cost.memory import human_bytes
from attn_explorer.gui.stats import (doubling_factor, fit_quadratic, head_entropy_and_peak, human_count,
                                     quadratic_share)
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


class InputPanel(QGroupBox):
    """Text box (live, debounced) and image choices."""

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

        row = QHBoxLayout()
        row.addWidget(self.open_image)
        row.addWidget(self.samples, 1)
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("Text (live):"))
        lay.addWidget(self.text)
        lay.addWidget(QLabel("Image (open, drop onto the window, or a sample):"))
        lay.addLayout(row)
        lay.addWidget(self.current)

        self.text.textChanged.connect(self.debounce.start)
        self.debounce.timeout.connect(self._send_text)
        self.open_image.clicked.connect(self.open_image_requested)
        self.samples.activated.connect(self._sample_chosen)
        state.attention_ready.connect(deferred(self, self._describe))

    def _send_text(self) -> None:
        self.state.set_text(self.text.toPlainText())

    def _sample_chosen(self, index: int) -> None:
        path = self.samples.itemData(index)
        if path:
            self.state.set_image(path)

    def _describe(self) -> None:
        r = self.state.result
        if r is None:
            return
        if r.grid is not None:
            src = self.state.image
            name = Path(src).name if isinstance(src, str) else "image"
            self.current.setText(f"Showing image {name}: {r.image.shape[1]}×{r.image.shape[0]} px, "
                                 f"{r.grid[0]}×{r.grid[1]} patches.")
        else:
            cut = " (cut: first tokens only)" if r.truncated or self.state.max_tokens else ""
            self.current.setText(f"Showing text: {r.num_tokens} tokens{cut}.")


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
        state.model_loaded.connect(lambda *_: self._show_value())

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
        L, H, N, _ = r.attentions.shape
        st = self.state
        self.entropy, self.peak = head_entropy_and_peak(r.attentions[st.layer])
        e, m = float(self.entropy[st.head]), float(self.peak[st.head])
        top = math.log2(N) if N > 1 else 0.0
        self.readout.setText(
            f"Layer {st.layer}, head {st.head}: mean row entropy <b>{e:.2f} bits</b> "
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


class SeqLenPanel(QGroupBox):
    """Choose n (first tokens, or image resolution); read the n² cost; measure time against n.

    Every run the user makes adds a small grey dot (n, forward ms). "Measure n sweep" times the model
    at log-spaced n in the background (median of a few runs each) and fits a·n² + b·n + c through
    those points, so the quadratic part of the cost shows as a curve.
    """

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__("Sequence length n", parent)
        self.state = state
        self.slider = QSlider(Qt.Horizontal)
        self.slider.setRange(1, 1)
        self.value = QLabel("")
        self.value.setMinimumWidth(90)
        self.readout = QLabel("")
        self.readout.setWordWrap(True)
        self.readout.setTextFormat(Qt.RichText)
        self.sweep_button = QPushButton("Measure n sweep")
        self.sweep_button.setToolTip("Time the model at n from 8 up to its maximum, in the background")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setTextVisible(True)
        self.progress.setFormat("")
        self.sweep_readout = QLabel("")
        self.sweep_readout.setWordWrap(True)
        self.sweep_readout.setTextFormat(Qt.RichText)
        self.plot = pg.PlotWidget()
        self.plot.setFixedHeight(170)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setLabel("left", "forward ms")
        self.plot.setLabel("bottom", "n (tokens)")
        self.live_points = pg.ScatterPlotItem(size=5, brush="#bbbbbb", pen=None)  # the user's own runs
        self.sweep_scatter = pg.ScatterPlotItem(size=7, brush="#4c78a8", pen=None)  # sweep medians
        self.curve = pg.PlotCurveItem(pen=pg.mkPen("#e45756", width=2))
        for it in (self.curve, self.live_points, self.sweep_scatter):
            self.plot.addItem(it)
        self.debounce = QTimer(self)
        self.debounce.setSingleShot(True)
        self.debounce.setInterval(30)
        self.fit: np.ndarray | None = None
        self._image_mode = False

        row = QHBoxLayout()
        row.addWidget(self.slider, 1)
        row.addWidget(self.value)
        sweep_row = QHBoxLayout()
        sweep_row.addWidget(self.sweep_button)
        sweep_row.addWidget(self.progress, 1)
        sweep_row.addWidget(self.cancel_button)
        lay = QVBoxLayout(self)
        lay.addLayout(row)
        lay.addWidget(self.readout)
        lay.addLayout(sweep_row)
        lay.addWidget(self.plot)
        lay.addWidget(self.sweep_readout)

        self.slider.valueChanged.connect(self._moved)
        self.debounce.timeout.connect(self._send)
        self.sweep_button.clicked.connect(self.start_sweep)
        self.cancel_button.clicked.connect(state.cancel_sweep)
        state.attention_ready.connect(deferred(self, self.refresh))
        state.model_loaded.connect(self._model_loaded)
        state.sweep_started.connect(self._sweep_started)
        state.sweep_progressed.connect(self._sweep_progressed)
        state.sweep_point_measured.connect(lambda *_: self.redraw_plot())
        state.sweep_finished.connect(self._sweep_finished)

    # ------------------------------------------------------------------------------ slider
    def _moved(self, v: int) -> None:
        self._show_value(v)
        self.debounce.start()

    def _show_value(self, v: int) -> None:
        info = self.state.info
        if self._image_mode and info is not None and info.patch_size:
            self.value.setText(f"{v * info.patch_size} px")
        else:
            self.value.setText(f"n = {v}")

    def _send(self) -> None:
        v = self.slider.value()
        info = self.state.info
        if self._image_mode and info is not None and info.patch_size:
            self.state.set_image_size(v * info.patch_size)
        else:
            self.state.set_max_tokens(v if v < self.slider.maximum() else None)

    def _model_loaded(self, info) -> None:
        self.fit = None
        self.sweep_readout.setText("")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("")
        self.redraw_plot()

    def refresh(self) -> None:
        st = self.state
        info, r = st.info, st.result
        if info is None or r is None:
            return
        self._image_mode = r.grid is not None
        self.slider.blockSignals(True)
        if self._image_mode and info.patch_size:
            side = r.image.shape[0] if r.image is not None else (info.image_size or 224)
            default = (info.image_size or side) // info.patch_size
            self.setTitle("Image size → number of patches n")
            self.slider.setRange(2, max(default * 2, side // info.patch_size, 4))
            self.slider.setValue(side // info.patch_size)
        else:
            self.setTitle("Sequence length n (first tokens)")
            # the whole input's length, as far as the model can read
            top = max(min(r.total_tokens or r.num_tokens, info.max_positions), r.num_tokens, 2)
            self.slider.setRange(1, top)
            self.slider.setValue(r.num_tokens)
        self.slider.blockSignals(False)
        self._show_value(self.slider.value())
        n = r.num_tokens
        L, H, d = info.num_layers, info.num_heads, info.hidden_size
        flops = 4 * n * n * d
        nbytes = L * H * n * n * 4
        self.readout.setText(
            f"<b>{n}×{n}</b> attention per head · FLOPs ≈ 4·n²·d = <b>{human_count(flops, 'FLOP')}</b> per layer"
            f" · L·H·n²·4 B = <b>{human_bytes(nbytes)}</b> of attention maps"
            f" · forward <b>{r.forward_ms:.1f} ms</b>")
        self.redraw_plot()

    # ------------------------------------------------------------------------------ sweep
    def start_sweep(self) -> bool:
        return self.state.start_sweep()

    def _sweep_started(self, lengths: int) -> None:
        self.sweep_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.progress.setFormat(f"measuring {lengths} lengths… %p%")
        self.sweep_readout.setText("Measuring: each blue dot is the median of "
                                   f"{self.state.sweep_repeats} forward passes.")
        self.redraw_plot()

    def _sweep_progressed(self, done: int, total: int) -> None:
        self.progress.setValue(int(1000 * done / max(1, total)))

    def _sweep_finished(self, complete: bool) -> None:
        self.sweep_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.progress.setFormat("sweep done" if complete else "sweep stopped")
        if complete:
            self.progress.setValue(self.progress.maximum())
        self.redraw_plot()

    # ------------------------------------------------------------------------------ plot
    def redraw_plot(self) -> None:
        st = self.state
        live = np.asarray(st.timings, float).reshape(-1, 2)
        sweep = np.asarray(sorted(st.sweep_points), float).reshape(-1, 2)
        self.live_points.setData(live[:, 0], live[:, 1])
        self.sweep_scatter.setData(sweep[:, 0], sweep[:, 1])
        used = sweep if len(sweep) >= 3 else live
        self.fit = fit_quadratic(used[:, 0], used[:, 1])
        both = np.concatenate([live, sweep])
        top_n = float(both[:, 0].max()) if len(both) else 16.0
        top_ms = float(both[:, 1].max()) if len(both) else 1.0
        if self.fit is not None:
            xs = np.linspace(0, top_n, 100)
            ys = np.polyval(self.fit, xs)
            self.curve.setData(xs, ys)
            top_ms = max(top_ms, float(ys.max()))
        else:
            self.curve.setData([], [])
        # from 0, so the curve's shape reads right; padded, so one point is not a degenerate range
        self.plot.setXRange(0, max(top_n * 1.08, top_n + 3), padding=0)
        self.plot.setYRange(0, max(top_ms * 1.12, 1e-3), padding=0)
        self._describe_sweep(sweep)

    def _describe_sweep(self, sweep: np.ndarray) -> None:
        st = self.state
        if len(sweep) == 0:
            if not st.sweeping:
                self.sweep_readout.setText("Grey dots: your runs. Press <i>Measure n sweep</i> to time n from "
                                           "8 to the model's maximum and fit a·n² + b·n + c.")
            return
        ns = sweep[:, 0].astype(int)
        where = (f"image sizes {ns.min()}–{ns.max()} tokens (square grids of patches + [CLS])"
                 if self._image_mode else f"n = {ns.min()}…{ns.max()}")
        parts = [f"<b>n sweep</b>: {len(ns)} lengths, {where}, median of {st.sweep_repeats} runs each"]
        if st.sweep_repeated_input and not self._image_mode:
            parts[0] += "; <i>input repeated to reach n</i>"
        if self.fit is not None and len(sweep) >= 3:
            a, b, c = self.fit
            parts.append(f"fit: <b>{a:.2e}·n² + {b:.2e}·n + {c:.2f} ms</b>")
            hi = int(ns.max())
            factor = doubling_factor(self.fit, hi)
            if factor is not None:
                parts.append(f"doubling n from {hi // 2} to {hi} multiplies time by <b>×{factor:.2f}</b> "
                             "(pure n² would be ×4, pure n ×2)")
            share = quadratic_share(self.fit, hi)
            if share is not None and share >= 0:
                parts.append(f"at n = {hi} the n² term is {share:.0%} of the fitted time")
            if a <= 0 or sweep[-1, 1] < sweep[:, 1].max():
                parts.append("<b>these timings are noisy</b> (the longest n was not the slowest): is another "
                             "program using the processor? Measure again when it is idle")
        elif st.sweeping:
            parts.append("the fit appears after three lengths")
        self.sweep_readout.setText("; ".join(parts) + ".")
