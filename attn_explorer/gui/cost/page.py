"""The Cost page: attention's time and memory against n, measured live for each variant.

Pick n on a log slider, tick variants, press Run: the session's CostSweep measures n = 64, 128, …
up to the slider, and every measured point lands on two log-log plots (time, peak memory) as soon
as it exists, each time with its fastest–slowest spread. On log-log axes a cost that grows as n^p
is a straight line of slope p; the legends give each variant's p, fitted over the large-n points.
While it runs, the status line says what runs next and about how long the rest will take.
Letting go of the slider after moving it measures that one n, when that is quick (estimated at most
SLIDER_RUN_CAP_S from the points measured so far, or a pessimistic guess before any); a longer run
waits for the Measure n button, and a click on the handle that moves nothing measures nothing. Beside the table, the variants can be measured on the
loaded model's own q, k, v for the input on screen.

This page only draws and forwards intent: it gets everything from session/cost_sweep.py (the
variant list, the memory budget and guard, fits and the noise verdict) as plain data.
"""
from __future__ import annotations

import math
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QApplication, QCheckBox, QComboBox, QFrame, QHBoxLayout, QLabel, QProgressBar,
                               QPushButton, QSizePolicy, QSlider, QSpinBox, QSplitter, QTabWidget, QVBoxLayout,
                               QWidget)

from attn_explorer.gui.cost.plots import N_MIN, CostPlots
from attn_explorer.gui.cost.tables import QKVPanel, ResultsTable
from attn_explorer.session.cost_sweep import (FIT_GROWTH, FIT_RULE, VARIANTS, CostSweep, budget_bytes,
                                              estimate_seconds, fitted_slopes, human_bytes, human_seconds,
                                              largest_fitting_n, matrix_bytes, noise_line)

N_CAP = 1 << 16  # the slider stops here even when memory would allow more: a CPU run takes minutes
GUI_TIME_BUDGET_S = 2.0  # stop timing one point after about this long (at least one timed run)
SLIDER_RUN_CAP_S = 3.0  # letting go of the slider measures that n only when it should take about this long at most


def _log_n_values(n_max: int) -> list[int]:
    values, n = [], N_MIN
    while n <= n_max:
        values.append(n)
        n *= 2
    return values


class _PageLayout(QVBoxLayout):
    """The page's own layout. It keeps its wrapped labels' height-for-width to itself: a scroll area
    (the main window puts tall pages in one) would otherwise size the page by the sum of every
    part's preferred height and scroll, instead of fitting it to the window."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt's name
        return False


def _pair(*widgets: QWidget) -> QWidget:
    """Widgets that stay together in a row (a label and its box)."""
    box = QWidget()
    lay = QHBoxLayout(box)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(4)
    for w in widgets:
        lay.addWidget(w)
    return box


def _spin(lo: int, hi: int, value: int, tip: str = "") -> QSpinBox:
    spin = QSpinBox()
    spin.setRange(lo, hi)
    spin.setValue(value)
    spin.setToolTip(tip)
    return spin


# the models' local layers, tied to the window variant (non-overlapping windows of w, core/efficient.py)
LOCAL_LAYERS = ("Local layers (Gemma, Mistral) see only the last w tokens, a sliding window: like this "
                "variant's fixed windows, their cost grows as n·w, not n².")


class CostPage(QWidget):
    """The cost lab tab. Tests drive it through the public widgets, `n_values`, and the signals."""

    point_measured = Signal(object)  # one Measurement dict, as it arrives
    sweep_started = Signal()
    sweep_finished = Signal(str)  # "done", "cancelled" or "failed: <one line>"

    def __init__(self, state: Any = None, sweep: CostSweep | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.sweep = sweep or CostSweep(state, parent=self)
        self.points: list[dict] = []  # measured points of the current settings, newest last
        self._n_override: list[int] | None = None
        self.budget_override: int | None = None  # bytes; None = the device's default budget
        # Redraws are batched: drawing competes for the same cores the worker is timing on.
        self._redraw_timer = QTimer(self)
        self._redraw_timer.setSingleShot(True)
        self._redraw_timer.setInterval(150)
        self._redraw_timer.timeout.connect(self._redraw)

        # controls --------------------------------------------------------------------------
        self.n_slider = QSlider(Qt.Horizontal)
        self.n_slider.setPageStep(1)
        self.n_slider.setTickPosition(QSlider.TicksBelow)
        self.n_label = QLabel("")
        self.n_label.setMinimumWidth(90)
        self.heads_spin = _spin(1, 128, 12, "attention heads H")
        self.dk_spin = _spin(1, 1024, 64, "width d_k of each head's q, k and v")
        self.window_spin = _spin(1, 1 << 16, 128, "window attention: each token sees the w tokens of its window. "
                                 + LOCAL_LAYERS)
        self.repeats_spin = _spin(1, 50, 3, "timed runs per point after one warm-up, interleaved across the "
                                            "variants; the median is drawn, with a bar from fastest to slowest")
        self.device_box = QComboBox()
        self.device_box.addItems(["cpu", "cuda"])
        self.live_box = QCheckBox("on release")
        self.live_box.setChecked(True)
        self.live_box.setToolTip(f"letting go of the slider after moving it measures the ticked variants at that n, "
                                 f"when that should take at most about {SLIDER_RUN_CAP_S:g} s; a longer run waits "
                                 "for Measure n")
        self.variant_boxes: dict[str, QCheckBox] = {}
        for name, v in VARIANTS.items():
            box = QCheckBox(name)
            box.setChecked(True)
            box.setToolTip(f"{v['label']}: {v['blurb']}" + (f". {LOCAL_LAYERS}" if name == "window" else ""))
            box.setStyleSheet(f"QCheckBox {{ color: {v['colour']}; font-weight: bold; }}")
            self.variant_boxes[name] = box
        self.run_button = QPushButton("Run sweep")
        self.run_button.setToolTip("measure n = 64, 128, … up to the slider for every ticked variant")
        self.measure_button = QPushButton("Measure n")
        self.measure_button.setToolTip("measure the ticked variants at the slider's n only")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self._pressed_n: int | None = None  # the slider's value when its handle was grabbed
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setTextVisible(False)
        self.progress_bar.setMaximumWidth(120)
        self.status_label = QLabel("Press Run to measure.")
        self.status_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.eta_label = QLabel("")
        self.readout = QLabel("")
        self.readout.setWordWrap(True)
        self.readout.setTextFormat(Qt.RichText)
        self.readout.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Minimum)

        self.plots = CostPlots(VARIANTS, FIT_RULE, FIT_GROWTH)
        self.table = ResultsTable(VARIANTS)
        self.table.setMinimumHeight(60)
        self.qkv_panel = QKVPanel(VARIANTS)

        # layout --------------------------------------------------------------------------
        controls = QFrame()
        controls.setFrameShape(QFrame.StyledPanel)
        grid = QVBoxLayout(controls)
        grid.setContentsMargins(6, 4, 6, 4)
        grid.setSpacing(3)
        row = QHBoxLayout()
        row.addWidget(QLabel("n"))
        row.addWidget(self.n_slider, 1)
        row.addWidget(self.n_label)
        grid.addLayout(row)
        # fixed rows sized for the ~620 px the page gets beside the side panels at 1024×700
        row = QHBoxLayout()
        for text, w in (("heads", self.heads_spin), ("d_k", self.dk_spin), ("window w", self.window_spin),
                        ("repeats", self.repeats_spin), ("device", self.device_box)):
            row.addWidget(_pair(QLabel(text), w))
            row.addSpacing(4)
        row.addStretch(1)
        grid.addLayout(row)
        row = QHBoxLayout()
        row.addWidget(QLabel("variants"))
        for box in self.variant_boxes.values():
            row.addWidget(box)
        row.addStretch(1)
        grid.addLayout(row)
        row = QHBoxLayout()
        row.addWidget(self.run_button)
        row.addWidget(self.measure_button)
        row.addWidget(self.live_box)
        row.addWidget(self.cancel_button)
        row.addWidget(self.progress_bar)
        row.addWidget(self.status_label, 1)
        row.addWidget(self.eta_label)
        grid.addLayout(row)
        grid.addWidget(self.readout)

        self.bottom_tabs = QTabWidget()
        self.bottom_tabs.addTab(self.table, "Measurements (random q, k, v)")
        self.bottom_tabs.addTab(self.qkv_panel, "On the model's own q, k, v")
        split = QSplitter(Qt.Vertical)
        split.addWidget(self.plots)
        split.addWidget(self.bottom_tabs)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setChildrenCollapsible(False)
        lay = _PageLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(controls)
        lay.addWidget(split, 1)

        # wiring --------------------------------------------------------------------------
        self.n_slider.valueChanged.connect(self._n_moved)
        self.n_slider.sliderPressed.connect(self._n_pressed)
        self.n_slider.sliderReleased.connect(self._n_released)
        self.run_button.clicked.connect(lambda: self.run_sweep())
        self.measure_button.clicked.connect(lambda: self.run_sweep([self.current_n]))
        self.cancel_button.clicked.connect(self.cancel)
        for box in self.variant_boxes.values():
            box.toggled.connect(self._update_slider_range)
        for spin in (self.heads_spin, self.dk_spin, self.window_spin):
            spin.valueChanged.connect(self._settings_changed)
        self.device_box.currentTextChanged.connect(self._settings_changed)
        self.sweep.point_measured.connect(self._add_point)
        self.sweep.progressed.connect(self._progress)
        self.sweep.sweep_finished.connect(self._finished)
        self.sweep.qkv_target_changed.connect(self.qkv_panel.set_target)
        self.sweep.qkv_measured.connect(self.qkv_panel.show_result)
        self.sweep.qkv_failed.connect(self.qkv_panel.show_error)
        self.sweep.qkv_cleared.connect(lambda: self.qkv_panel.clear(self.sweep.qkv_target()))
        self.qkv_panel.measure_requested.connect(self.measure_qkv)
        self.qkv_panel.set_target(self.sweep.qkv_target())
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        self._update_slider_range()
        self.n_slider.setValue(min(self.n_slider.maximum(), 6))  # n = 4096
        self._n_moved(self.n_slider.value())
        self._redraw()  # an empty legend and an n axis from 64 to the slider until points arrive

    # --- settings ------------------------------------------------------------------------

    def checked_variants(self) -> list[str]:
        return [name for name, box in self.variant_boxes.items() if box.isChecked()]

    def settings(self, ns: list[int]) -> dict:
        """The sweep's settings as SweepConfig fields."""
        return dict(ns=list(ns), impls=self.checked_variants(), heads=self.heads_spin.value(),
                    d_k=self.dk_spin.value(), window=self.window_spin.value(), repeats=self.repeats_spin.value(),
                    device=self.device_box.currentText(), time_budget_s=GUI_TIME_BUDGET_S,
                    budget_bytes=self.budget_override)

    def budget_bytes(self) -> int:
        """The memory guard's budget for the chosen device."""
        return self.budget_override if self.budget_override is not None else budget_bytes(self.device_box.currentText())

    def largest_n(self) -> int:
        """The largest slider n at which some ticked variant fits the budget (capped at N_CAP)."""
        settings = self.settings([N_MIN]) | {"impls": self.checked_variants() or list(VARIANTS)}
        return largest_fitting_n(settings, self.budget_bytes(), _log_n_values(N_CAP)) or N_MIN

    # --- n -------------------------------------------------------------------------------

    @property
    def current_n(self) -> int:
        return N_MIN << self.n_slider.value()

    @property
    def n_values(self) -> list[int]:
        """The sizes Run sweeps: 64, 128, … up to the slider's n, unless set explicitly."""
        if self._n_override is not None:
            return list(self._n_override)
        return _log_n_values(self.current_n)

    @n_values.setter
    def n_values(self, values: list[int] | None) -> None:
        self._n_override = None if values is None else [int(v) for v in values]

    def _update_slider_range(self, *_: Any) -> None:
        top = int(math.log2(self.largest_n() // N_MIN))
        self.n_slider.setRange(0, top)
        self._n_moved(self.n_slider.value())

    def _n_moved(self, _value: int) -> None:
        n = self.current_n
        self.n_label.setText(f"n = {n:,}")
        self.plots.set_n(n, self.points)
        h = self.heads_spin.value()
        self.readout.setText(
            f"At <b>n = {n:,}</b> one layer's exact attention matrix is {h} heads × {n:,}² × 4 bytes = "
            f"<b>{human_bytes(matrix_bytes(n, h))}</b> (4× per doubling of n). Memory budget per run "
            f"{human_bytes(self.budget_bytes())}: n up to {N_MIN << self.n_slider.maximum():,}.")

    def _n_pressed(self) -> None:
        self._pressed_n = self.n_slider.value()

    def estimate_seconds(self, n: int) -> float:
        """About how long measuring the ticked variants at n takes (see session.cost_sweep.estimate_seconds)."""
        return estimate_seconds(self.points, self.settings([n]), n)

    def _n_released(self) -> None:
        """Measure the n the slider was dragged to, if that is quick; a click that moved nothing does nothing."""
        pressed, self._pressed_n = self._pressed_n, None
        if pressed is None or pressed == self.n_slider.value() or not self.live_box.isChecked() or self.is_running:
            return
        if not self.checked_variants():
            self.status_label.setText("Tick at least one variant.")
            return
        n = self.current_n
        seconds = self.estimate_seconds(n)
        if seconds > SLIDER_RUN_CAP_S:
            self.status_label.setText(f"n = {n:,} would take {human_seconds(seconds)}: press Measure n to run it")
            return
        self.run_sweep([n])

    def _settings_changed(self, *_: Any) -> None:
        """Points measured with other heads, d_k, window or device are not comparable: start over."""
        if not self.is_running:
            self.clear()
        self._update_slider_range()

    # --- running -------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self.sweep.is_running

    def run_sweep(self, ns: list[int] | None = None) -> bool:
        """Start measuring ns (default: n_values). False if a sweep is running or nothing is ticked."""
        if self.is_running:
            return False
        if not self.checked_variants():
            self.status_label.setText("Tick at least one variant.")
            return False
        ns = list(ns) if ns is not None else self.n_values
        after = " (after the cancelled call ends)" if self.sweep.busy else ""
        if not self.sweep.start(self.settings(ns)):
            return False
        self.run_button.setEnabled(False)
        self.measure_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress_bar.setValue(0)
        self.eta_label.setText("")
        self.status_label.setText((f"measuring n = {ns[0]:,}…" if len(ns) == 1 else
                                   f"measuring n = {ns[0]:,} … {ns[-1]:,}") + after)
        self.sweep_started.emit()
        return True

    def cancel(self) -> None:
        """Stop before the next call (a kernel cannot be interrupted halfway)."""
        self.sweep.cancel()  # sweep_finished("cancelled") follows at once; the call in flight ends on its own

    def measure_qkv(self) -> bool:
        """Measure the ticked variants on the loaded model's q, k, v (selected layer, input on screen)."""
        if not self.checked_variants() or not self.sweep.measure_qkv(self.settings([N_MIN])):
            return False
        self.qkv_panel.set_busy()
        return True

    def shutdown(self, wait_ms: int = 30000) -> None:
        """Stop any job and wait for it (app exit, tests)."""
        self.sweep.shutdown(wait_ms)

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self.shutdown()
        super().closeEvent(event)

    def _progress(self, fraction: float, message: str, left: str) -> None:
        if not self.cancel_button.isEnabled():
            return  # cancelling: keep saying so
        self.progress_bar.setValue(int(round(1000 * fraction)))
        self.status_label.setText(message)
        self.eta_label.setText(left or "estimating time left…")

    def _finished(self, outcome: str) -> None:
        self._redraw_timer.stop()
        self._redraw()
        self.run_button.setEnabled(True)
        self.measure_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.eta_label.setText("")
        if outcome == "done":
            self.progress_bar.setValue(1000)
            self.status_label.setText(f"done: {len(self.points)} points measured")
        elif outcome == "cancelled":
            self.status_label.setText(f"cancelled: {len(self.points)} points kept")
        else:
            self.status_label.setText(outcome)
        self.sweep_finished.emit(outcome)

    # --- points --------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget the measured points, and every line that described them."""
        self.points.clear()
        self.table.setRowCount(0)
        if not self.is_running:
            self.progress_bar.setValue(0)
            self.status_label.setText("Press Run to measure.")
        self._redraw()

    def _add_point(self, rec: dict) -> None:
        key = (rec["n"], rec["impl"])
        self.points = [p for p in self.points if (p["n"], p["impl"]) != key] + [rec]
        self.table.put(rec)
        if not self._redraw_timer.isActive():
            self._redraw_timer.start()
        self.point_measured.emit(rec)

    def slopes(self) -> dict[str, dict[str, Any]]:
        """Fitted log-log slopes per variant: {"chunked": {"time": 1.9, "memory": 1.0, …}, …}."""
        return fitted_slopes(self.points)

    def _redraw(self) -> None:
        self.plots.draw(self.points, self.slopes(), noise_line(self.points), self.current_n)
