"""The sequence-length panel: choose n, read what n costs, and time the model against n.

What it shows is what was run: the slider, its "n = k" label and the "k×k attention" text all come
from the result on screen, and the slider starts at the model's smallest n (`ModelInfo.min_tokens`:
with [CLS] and [SEP], one real token needs n = 3). The forward-ms plot draws a quadratic fit only when
the data can carry one (the session's `sweep.time_fit`); otherwise it says why there is none.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QLabel, QProgressBar, QPushButton, QSlider, QVBoxLayout, QWidget
from superqt.utils import signals_blocked

from attn_explorer.gui.explorer.controls import deferred
from attn_explorer.gui.widgets.stats import human_count, human_duration, work_line
from attn_explorer.session.cost_sweep import human_bytes
from attn_explorer.session.live_run import incomplete
from attn_explorer.session.state import SessionState
from attn_explorer.session.sweep import time_fit
from attn_explorer.session.vlm import patch_grid_of


def forward_word(r) -> str:
    """"forward so far" for a long run shown while it is computed (or stopped part-way), whose forward_ms is the
    time its finished layers took; "forward" for a whole run."""
    return "forward so far" if incomplete(r) else "forward"


def shared_note(shared: dict[str, float]) -> tuple[str, str]:
    """(" (beside other jobs)", a tooltip naming them) for a forward timed while side jobs ran on the same cores
    (SessionState.shared_cores); ("", "") for one that ran alone."""
    if not shared:
        return "", ""
    return (" (beside other jobs)", f"Timed while other jobs ran on the same cores ({work_line(shared)}), so the "
            "model alone takes less. This time is not plotted on the Sequence page.")


def smallest_n(info, result) -> int:
    """The smallest n that still holds one real token: ModelInfo.min_tokens, or (while a model does not
    state it) the special tokens the result carries plus one."""
    stated = getattr(info, "min_tokens", None)
    if stated:
        return int(stated)
    if result is not None and result.grid is None:
        return int(np.count_nonzero(result.special)) + 1
    return 1


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
        self.plot.hide()  # until the first result: empty axes would only show made-up ranges
        # why no curve is drawn: a line above the plot, never over it (over the plot it hid the slowest point)
        self.no_fit = QLabel("")
        self.no_fit.setWordWrap(True)
        self.no_fit.setStyleSheet("color: #555;")
        self.no_fit.hide()
        self.live_points = pg.ScatterPlotItem(size=5, brush="#bbbbbb", pen=None)  # the user's own runs
        self.sweep_scatter = pg.ScatterPlotItem(size=7, brush="#4c78a8", pen=None)  # sweep medians
        self.curve = pg.PlotCurveItem(pen=pg.mkPen("#e45756", width=2))
        for it in (self.curve, self.live_points, self.sweep_scatter):
            self.plot.addItem(it)
        self.debounce = QTimer(self)
        self.debounce.setSingleShot(True)
        self.debounce.setInterval(30)
        self.fit: np.ndarray | None = None
        self.no_fit_reason = ""
        for w in (self.slider, self.sweep_button):  # nothing to cut or time before a model is there
            w.setEnabled(False)
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
        lay.addWidget(self.no_fit)
        lay.addWidget(self.plot)
        lay.addWidget(self.sweep_readout)

        self.slider.valueChanged.connect(self._moved)
        self.debounce.timeout.connect(self._send)
        self.sweep_button.clicked.connect(self.start_sweep)
        self.cancel_button.clicked.connect(state.cancel_sweep)
        state.attention_ready.connect(deferred(self, self.refresh))
        state.model_loaded.connect(self._model_loaded)
        state.input_cleared.connect(self._cleared)
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
        self.sweep_button.setEnabled(not self.state.sweeping)  # a model is there to time
        self.fit = None
        self.sweep_readout.setText("")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("")
        self.progress.setToolTip("")  # it described the old model's sweep
        self.redraw_plot()

    def _cleared(self) -> None:
        """No input: no n to choose, and nothing to say about the maps that went."""
        self.debounce.stop()
        self.slider.setEnabled(False)
        self.value.setText("")
        self.readout.setText("")

    def refresh(self) -> None:
        st = self.state
        info, r = st.info, st.result
        if info is None or r is None:
            return
        self._image_mode = patch_grid_of(r) is not None  # a vision-language run: its tokens (issue 26 B)
        with signals_blocked(self.slider):
            self._set_slider(info, r)
        self._show_value(self.slider.value())
        self._describe(info, r)
        if patch_grid_of(r) is None and r.grid is not None:  # a vision-language run (issue 26 B): no cut offered
            self.slider.setEnabled(False)
            self.slider.setToolTip("a vision-language run reads the whole picture and prompt: the cut to the first "
                                   "n tokens is not offered for it yet")
        elif "vision-language" in self.slider.toolTip():
            self.slider.setToolTip("")

    def _set_slider(self, info, r) -> None:
        if self._image_mode and info.patch_size:
            side = r.image.shape[0] if r.image is not None else (info.image_size or 224)
            default = (info.image_size or side) // info.patch_size
            self.setTitle("Image size → number of patches n")
            self.slider.setRange(2, max(default * 2, side // info.patch_size, 4))
            self.slider.setValue(side // info.patch_size)
        else:
            self.setTitle("Sequence length n (first tokens)")
            # the whole input's length, as far as the model can read and the memory can hold
            can = min(info.max_positions, self.state.fit_tokens or info.max_positions)
            top = max(min(r.total_tokens or r.num_tokens, can), r.num_tokens, 2)
            self.slider.setRange(min(smallest_n(info, r), r.num_tokens), top)
            self.slider.setValue(r.num_tokens)

    def _describe(self, info, r) -> None:
        st = self.state
        self.plot.show()
        self.slider.setEnabled(True)
        if not st.sweeping:
            self.sweep_button.setEnabled(True)
        n = r.num_tokens
        L, H, d = info.num_layers, info.num_heads, info.hidden_size
        flops = 4 * n * n * d
        elem = 2 if info.dtype in ("bfloat16", "float16") else 4  # the maps are kept in the model's dtype
        nbytes = L * H * n * n * elem
        store = getattr(r, "lazy", None)
        if store is not None:  # a long input: the maps were not kept, only what computes them again
            memory = (f" · kept: q, k and row statistics, <b>{human_bytes(store.bytes_kept)}</b> "
                      f"(the L·H·n²·{elem} B maps would be {human_bytes(nbytes)})")
        else:
            memory = f" · L·H·n²·{elem} B = <b>{human_bytes(nbytes)}</b> of attention maps"
        self.readout.setText(
            f"<b>{n:,}×{n:,}</b> attention per head · FLOPs ≈ 4·n²·d = <b>{human_count(flops, 'FLOP')}</b> per layer"
            + memory +
            f" · {forward_word(r)} <b>{human_duration(r.forward_ms)}</b>" + (" (first run: includes warm-up, not plotted)" if r.warm_up else "")
            + (" (beside other jobs, not plotted)" if st.shared_cores(r) else ""))  # see shared_note
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
        beside, sweep = "", self.state.sweep
        if sweep.beside:  # timed beside other work even after measuring again (session.sweep.RETRIES)
            beside = f" · n = {', '.join(f'{n:,}' for n in sorted(sweep.beside))} beside other jobs"
        self.progress.setFormat(("sweep done" if complete else "sweep stopped") + beside)
        self.progress.setToolTip(f"Timed beside other jobs ({', '.join(sorted(sweep.beside_jobs))}) even when measured "
                                 "again: those points are slower than the model alone." if beside else "")
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
        used = sweep if len(sweep) else live
        self.time_fit = time_fit(used)
        self.fit = None if self.time_fit.coeffs is None else np.asarray(self.time_fit.coeffs)
        self.no_fit_reason = self.time_fit.reason
        both = np.concatenate([live, sweep])
        top_n = float(both[:, 0].max()) if len(both) else 16.0
        top_ms = float(both[:, 1].max()) if len(both) else 1.0
        if self.fit is not None:  # drawn over the measured n only: the fit says nothing outside them
            xs = np.linspace(float(used[:, 0].min()), float(used[:, 0].max()), 100)
            ys = np.polyval(self.fit, xs)
            self.curve.setData(xs, ys)
            top_ms = max(top_ms, float(ys.max()))
            self.no_fit.setText("")
            self.no_fit.hide()
        else:
            self.curve.setData([], [])
            self.no_fit.setText(self.no_fit_reason if len(both) else "")
            self.no_fit.setVisible(bool(len(both)))
        # from 0, so the curve's shape reads right; padded, so one point is not a degenerate range
        self.plot.setXRange(0, max(top_n * 1.08, top_n + 3), padding=0)
        self.plot.setYRange(0, max(top_ms * 1.12, 1e-3), padding=0)
        self._describe_sweep(sweep)

    def _describe_sweep(self, sweep: np.ndarray) -> None:
        st = self.state
        if len(sweep) == 0:
            if not st.sweeping:
                self.sweep_readout.setText("Grey dots: your runs. Press <i>Measure n sweep</i> to time n from "
                                           "8 to the model's maximum; a fit a·n² + b·n + c is drawn once five "
                                           "lengths spanning 4× are in.")
            return
        ns = sweep[:, 0].astype(int)
        where = (f"image sizes {ns.min()}–{ns.max()} tokens (square grids of patches + [CLS])"
                 if self._image_mode else f"n = {ns.min()}…{ns.max()}")
        parts = [f"<b>n sweep</b>: {len(ns)} lengths, {where}, median of {st.sweep_repeats} runs each"]
        if st.sweep_repeated_input and not self._image_mode:
            parts[0] += "; <i>input repeated to reach n</i>"
        if self.fit is not None:
            a, b, c = self.fit
            parts.append(f"fit: <b>{a:.2e}·n² + {b:.2e}·n + {c:.2f} ms</b>")
            hi = int(ns.max())
            factor = self.time_fit.doubling
            if factor is not None:
                parts.append(f"doubling n from {hi // 2} to {hi} multiplies time by <b>×{factor:.2f}</b> "
                             "(pure n² would be ×4, pure n ×2)")
            share = self.time_fit.quadratic_share
            if share is not None and share >= 0:
                parts.append(f"at n = {hi} the n² term is {share:.0%} of the fitted time")
        elif not st.sweeping:
            parts.append(self.no_fit_reason)
        if sweep[-1, 1] < sweep[:, 1].max():
            parts.append("<b>these timings are noisy</b> (the longest n was not the slowest): is another "
                         "program using the processor? Measure again when it is idle")
        elif st.sweeping and self.fit is None:
            parts.append("the fit appears once five lengths spanning 4× are in")
        self.sweep_readout.setText("; ".join(parts) + ".")
