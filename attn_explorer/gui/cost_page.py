"""The Cost page: attention's time and memory against n, measured live for each variant.

Pick n on a log slider, tick variants, press Run: a worker sweeps n = 64, 128, … up to the
slider, and every measured point lands on two log-log plots (time, peak memory) as soon as it
exists. On log-log axes a cost that grows as n^p is a straight line of slope p; the legend
shows each variant's fitted p. Releasing the slider measures that one n. Every number drawn
comes from a measurement (cost.measure); the only computed number is the readout of the exact
attention matrix's size, which says what the quadratic cost is about.

The sweep runs through the shared Worker (workers.py) on this page's own one-thread pool, so it
never starves the model's workers. Points cross to the GUI thread as plain dicts.
"""
from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, QThreadPool, QTimer, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView, QApplication, QCheckBox, QComboBox, QGridLayout, QGroupBox, QHBoxLayout, QHeaderView, QLabel,
    QProgressBar, QPushButton, QSlider, QSpinBox, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from attn_explorer.cost.fit import slopes as fit_slopes
from attn_explorer.cost.memory import default_budget, human_bytes, matrix_bytes, predict_bytes
from attn_explorer.session.workers import Worker

VARIANT_NAMES = ("naive", "chunked", "window", "linear", "sdpa")
APPROXIMATE = ("window", "linear")
COLOURS = {"naive": "#e45756", "chunked": "#4c78a8", "window": "#54a24b", "linear": "#b279a2", "sdpa": "#f58518"}
BLURBS = {
    "naive": "the whole n×n softmax, built in memory (the reference)",
    "chunked": "FlashAttention's tiles and online softmax, in PyTorch: exact, no n×n matrix",
    "window": "each token sees only its window of w tokens (Swin): O(n·w), approximate",
    "linear": "φ(q)(φ(k)ᵀv) with φ = elu + 1: O(n·d²), approximate",
    "sdpa": "torch's fused scaled_dot_product_attention, for reference",
}
N_MIN = 64
N_CAP = 1 << 16  # the slider stops here even when memory would allow more: a CPU run takes minutes
GUI_TIME_BUDGET_S = 2.0  # stop timing one point after this long (at least one timed run)


class _PointRelay(QObject):
    """Carries measured points from the worker thread to the GUI thread (queued)."""

    point = Signal(object)


def _sweep_job(config: dict, relay: _PointRelay, worker: Worker) -> int:
    """Runs in the pool thread: stream every Measurement of the sweep as a plain dict."""
    from attn_explorer.cost.measure import SweepConfig, resolve_device, sweep
    from attn_explorer.errors import UserError

    cfg = SweepConfig(**config)
    try:
        cfg.device = resolve_device(cfg.device)
        cfg.validate()
    except ValueError as exc:  # no such device, or a setting out of range: one line for the status bar
        raise UserError(str(exc)) from None
    count = 0

    def progress(done: int, total: int, message: str) -> None:
        worker.report_progress(done / max(total, 1), message)

    for rec in sweep(cfg, cancelled=lambda: worker.is_cancelled, progress=progress):
        try:
            relay.point.emit(rec.to_dict())
        except RuntimeError:  # the page is gone: stop measuring for nobody
            worker.cancel()
            break
        count += 1
    return count


def _short_n(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _n_ticks(lo: int, hi: int) -> list[list[tuple[float, str]]]:
    """Ticks for a log n axis: every power of two from lo to hi (the axis is in log10 units)."""
    ticks, n = [], 1
    while n <= hi:
        if n >= lo:
            ticks.append((math.log10(n), _short_n(n)))
        n *= 2
    return [ticks, []]


def _value_ticks(lo: float, hi: float) -> list[list[tuple[float, str]]]:
    """Ticks for a log value axis: decades labelled, and 2 and 5 between them when the span is short."""
    lo_e, hi_e = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    major = [(float(e), f"{10.0 ** e:g}") for e in range(lo_e, hi_e + 1)]
    minor = [(math.log10(m * 10.0 ** e), f"{m * 10.0 ** e:g}" if hi_e - lo_e <= 3 else "")
             for e in range(lo_e, hi_e + 1) for m in (2, 5)]
    return [major, minor]


def _log_n_values(n_max: int) -> list[int]:
    values, n = [], N_MIN
    while n <= n_max:
        values.append(n)
        n *= 2
    return values


class CostPage(QWidget):
    """The cost lab tab. Tests drive it through the public widgets, `n_values`, and the signals."""

    point_measured = Signal(object)  # one Measurement dict, as it arrives
    sweep_started = Signal()
    sweep_finished = Signal(str)  # "done", "cancelled" or "failed: <one line>"

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.points: list[dict] = []  # measured points of the current settings, newest last
        self._n_override: list[int] | None = None
        self._worker: Worker | None = None
        self._workers: set[Worker] = set()
        self._outcome = "done"
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)
        self._relay = _PointRelay(self)
        self._relay.point.connect(self._add_point)
        self._budget_cache: dict[str, int] = {}
        self.budget_override: int | None = None  # bytes; None = memory.default_budget(device)
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
        self.n_label.setMinimumWidth(80)
        self.heads_spin = QSpinBox()
        self.heads_spin.setRange(1, 128)
        self.heads_spin.setValue(12)
        self.dk_spin = QSpinBox()
        self.dk_spin.setRange(1, 1024)
        self.dk_spin.setValue(64)
        self.window_spin = QSpinBox()
        self.window_spin.setRange(1, 1 << 16)
        self.window_spin.setValue(128)
        self.window_spin.setToolTip("window attention: each token sees the w tokens of its window")
        self.repeats_spin = QSpinBox()
        self.repeats_spin.setRange(1, 50)
        self.repeats_spin.setValue(3)
        self.repeats_spin.setToolTip("timed runs per point after one warm-up; the median is shown")
        self.device_box = QComboBox()
        self.device_box.addItems(["cpu", "cuda"])
        self.live_box = QCheckBox("measure n on release")
        self.live_box.setChecked(True)
        self.live_box.setToolTip("letting go of the slider measures the ticked variants at that n")
        self.variant_boxes: dict[str, QCheckBox] = {}
        for name in VARIANT_NAMES:
            box = QCheckBox(name)
            box.setChecked(True)
            box.setToolTip(BLURBS[name])
            box.setStyleSheet(f"QCheckBox {{ color: {COLOURS[name]}; font-weight: bold; }}")
            self.variant_boxes[name] = box
        self.run_button = QPushButton("Run sweep")
        self.run_button.setToolTip("measure n = 64, 128, … up to the slider for every ticked variant")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(0)
        self.progress_bar.setTextVisible(False)
        self.status_label = QLabel("Press Run to measure.")
        self.readout = QLabel("")
        self.readout.setWordWrap(True)
        self.readout.setTextFormat(Qt.RichText)

        # plots ---------------------------------------------------------------------------
        self.time_plot = self._make_plot("time per call", "ms")
        self.memory_plot = self._make_plot("peak memory per call", "MB")
        self.curves: dict[str, tuple[pg.PlotDataItem, pg.PlotDataItem]] = {}
        for name in VARIANT_NAMES:
            pen = pg.mkPen(COLOURS[name], width=2)
            kw = dict(pen=pen, symbol="o", symbolSize=7, symbolBrush=COLOURS[name], symbolPen=None, name=name)
            self.curves[name] = (self.time_plot.plot([], [], **kw), self.memory_plot.plot([], [], **kw))
        self.not_run = self.memory_plot.plot([], [], pen=None, symbol="x", symbolSize=11, symbolPen=pg.mkPen("#333", width=2),
                                             name="not run (at its predicted need)")
        self.n_markers = []
        for plot in (self.time_plot, self.memory_plot):
            line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#888", width=1, style=Qt.DashLine))
            plot.addItem(line, ignoreBounds=True)
            self.n_markers.append(line)

        # results table -------------------------------------------------------------------
        self.table = QTableWidget(0, 6)
        self.table.setHorizontalHeaderLabels(["n", "variant", "ms", "peak MB", "error vs exact", "note"])
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.horizontalHeaderItem(4).setToolTip(
            "‖out − exact‖ / ‖exact‖ on random q, k, v. Random queries spread their attention over every "
            "key, so a local window misses most of it: real text is kinder to window attention.")
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.NoSelection)
        header = self.table.horizontalHeader()
        for col in range(5):
            header.setSectionResizeMode(col, QHeaderView.ResizeToContents)
        header.setStretchLastSection(True)

        # layout --------------------------------------------------------------------------
        controls = QGroupBox("Sweep")
        grid = QGridLayout(controls)
        grid.addWidget(QLabel("n"), 0, 0)
        grid.addWidget(self.n_slider, 0, 1, 1, 9)
        grid.addWidget(self.n_label, 0, 10)
        for col, (text, w) in enumerate((("heads", self.heads_spin), ("d_k", self.dk_spin),
                                          ("window w", self.window_spin), ("repeats", self.repeats_spin),
                                          ("device", self.device_box))):
            grid.addWidget(QLabel(text), 1, 2 * col, alignment=Qt.AlignRight)
            grid.addWidget(w, 1, 2 * col + 1)
        grid.addWidget(self.live_box, 1, 10)
        boxes = QHBoxLayout()
        boxes.addWidget(QLabel("variants"))
        for box in self.variant_boxes.values():
            boxes.addWidget(box)
        boxes.addStretch(1)
        boxes.addWidget(self.run_button)
        boxes.addWidget(self.cancel_button)
        grid.addLayout(boxes, 2, 0, 1, 11)
        progress_row = QHBoxLayout()
        progress_row.addWidget(self.progress_bar, 1)
        progress_row.addWidget(self.status_label, 2)
        grid.addLayout(progress_row, 3, 0, 1, 11)
        grid.addWidget(self.readout, 4, 0, 1, 11)

        plots = QWidget()
        plots_lay = QHBoxLayout(plots)
        plots_lay.setContentsMargins(0, 0, 0, 0)
        plots_lay.addWidget(self.time_plot)
        plots_lay.addWidget(self.memory_plot)
        split = QSplitter(Qt.Vertical)
        split.addWidget(plots)
        split.addWidget(self.table)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 1)
        self.table.setMinimumHeight(120)
        lay = QVBoxLayout(self)
        lay.addWidget(controls)
        lay.addWidget(split, 1)

        # wiring --------------------------------------------------------------------------
        self.n_slider.valueChanged.connect(self._n_moved)
        self.n_slider.sliderReleased.connect(self._n_released)
        self.run_button.clicked.connect(lambda: self.run_sweep())
        self.cancel_button.clicked.connect(self.cancel)
        for box in self.variant_boxes.values():
            box.toggled.connect(self._update_slider_range)
        for spin in (self.heads_spin, self.dk_spin, self.window_spin):
            spin.valueChanged.connect(self._settings_changed)
        self.device_box.currentTextChanged.connect(self._settings_changed)
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        self._update_slider_range()
        self.n_slider.setValue(self.n_slider.maximum() if self.n_slider.maximum() < 6 else 6)  # n = 4096
        self._n_moved(self.n_slider.value())
        self._redraw()  # an empty legend and an n axis from 64 to the slider until points arrive

    # --- small parts ---------------------------------------------------------------------

    @staticmethod
    def _make_plot(title: str, unit: str) -> pg.PlotWidget:
        plot = pg.PlotWidget()
        plot.setLogMode(x=True, y=True)
        plot.showGrid(x=True, y=True, alpha=0.25)
        plot.setTitle(title)
        plot.setLabel("bottom", "sequence length n")
        plot.setLabel("left", unit)
        plot.setMenuEnabled(False)
        plot.addLegend(offset=(-6, -6), labelTextSize="9pt", brush=pg.mkBrush(255, 255, 255, 210))
        plot.setMinimumHeight(220)
        return plot

    def checked_variants(self) -> list[str]:
        return [name for name, box in self.variant_boxes.items() if box.isChecked()]

    def _config(self, ns: list[int]) -> dict:
        return dict(ns=list(ns), impls=self.checked_variants(), heads=self.heads_spin.value(),
                    d_k=self.dk_spin.value(), window=self.window_spin.value(), repeats=self.repeats_spin.value(),
                    device=self.device_box.currentText(), time_budget_s=GUI_TIME_BUDGET_S,
                    budget_bytes=self.budget_override)

    def budget_bytes(self) -> int:
        """The memory guard's budget for the chosen device (read once per device)."""
        if self.budget_override is not None:
            return self.budget_override
        dev = self.device_box.currentText()
        if dev not in self._budget_cache:
            try:
                self._budget_cache[dev] = default_budget(dev)
            except Exception:  # noqa: BLE001 - no such device here: the run will say so
                self._budget_cache[dev] = default_budget("cpu")
        return self._budget_cache[dev]

    def largest_n(self) -> int:
        """The largest slider n at which some ticked variant fits the budget (capped at N_CAP)."""
        budget = self.budget_bytes()
        impls = self.checked_variants() or list(VARIANT_NAMES)
        h, d, w = self.heads_spin.value(), self.dk_spin.value(), self.window_spin.value()
        x = lambda n: h * n * d * 4  # noqa: E731 - one (1, H, n, d_k) float32 tensor
        best = N_MIN
        for n in _log_n_values(N_CAP):
            if any(predict_bytes(i, n, h, d, window=w) + 5 * x(n) <= budget for i in impls):
                best = n
        return best

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

    def _n_moved(self, v: int) -> None:
        n = self.current_n
        self.n_label.setText(f"n = {n:,}")
        for line in self.n_markers:
            line.setPos(math.log10(n))  # the plots are log-log: items sit at log10 coordinates
        if self.points:
            self._set_n_ticks()
        else:
            self._redraw()
        h = self.heads_spin.value()
        m = matrix_bytes(n, h)
        self.readout.setText(
            f"At <b>n = {n:,}</b> the exact attention matrix of one layer is {h} heads × {n:,}² scores × 4 bytes "
            f"= <b>{human_bytes(m)}</b>. Doubling n quadruples it. Memory budget for a run: "
            f"{human_bytes(self.budget_bytes())}; the slider stops at n = {N_MIN << self.n_slider.maximum():,}.")

    def _n_released(self) -> None:
        if self.live_box.isChecked() and not self.is_running:
            self.run_sweep([self.current_n])

    def _settings_changed(self, *_: Any) -> None:
        """Points measured with other heads, d_k or window are not comparable: start over."""
        if not self.is_running:
            self.clear()
        self._update_slider_range()

    # --- running -------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._worker is not None

    def run_sweep(self, ns: list[int] | None = None) -> bool:
        """Start measuring ns (default: n_values). False if a sweep is running or nothing is ticked."""
        if self.is_running:
            return False
        if not self.checked_variants():
            self.status_label.setText("Tick at least one variant.")
            return False
        ns = list(ns) if ns is not None else self.n_values
        worker = Worker(_sweep_job, self._config(ns), self._relay)
        worker.signals.progress.connect(self._progress)
        worker.signals.error.connect(self._failed)
        worker.signals.finished.connect(self._finished)
        self._worker = worker
        self._workers.add(worker)
        self._outcome = "done"
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress_bar.setValue(0)
        self.status_label.setText(f"measuring n = {ns[0]:,}…" if len(ns) == 1 else
                                  f"measuring n = {ns[0]:,} … {ns[-1]:,}")
        self.sweep_started.emit()
        worker.start(self._pool)
        return True

    def cancel(self) -> None:
        """Stop after the call in progress (a kernel cannot be interrupted halfway)."""
        if self._worker is not None:
            self._worker.cancel()
            self._outcome = "cancelled"
            self.cancel_button.setEnabled(False)
            self.status_label.setText("cancelling after the current call…")

    def shutdown(self, wait_ms: int = 30000) -> None:
        """Cancel any sweep and wait for its thread (app exit, tests)."""
        for w in list(self._workers):
            w.cancel()
        self._pool.waitForDone(wait_ms)

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self.shutdown()
        super().closeEvent(event)

    def _progress(self, fraction: float, message: str) -> None:
        self.progress_bar.setValue(int(round(1000 * fraction)))
        if self._outcome != "cancelled":
            self.status_label.setText(message)

    def _failed(self, message: str) -> None:
        self._outcome = f"failed: {message}"

    def _finished(self) -> None:
        self._workers.discard(self._worker)
        self._worker = None
        self._redraw_timer.stop()
        self._redraw()
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        if self._outcome == "done":
            self.progress_bar.setValue(1000)
            self.status_label.setText(f"done: {len(self.points)} points measured")
        elif self._outcome == "cancelled":
            self.status_label.setText(f"cancelled: {len(self.points)} points kept")
        else:
            self.status_label.setText(self._outcome)
        self.sweep_finished.emit(self._outcome)

    # --- points --------------------------------------------------------------------------

    def clear(self) -> None:
        self.points.clear()
        self.table.setRowCount(0)
        self._redraw()

    def _add_point(self, rec: dict) -> None:
        key = (rec["n"], rec["impl"])
        replaced = [i for i, p in enumerate(self.points) if (p["n"], p["impl"]) == key]
        for i in reversed(replaced):
            del self.points[i]
        self.points.append(rec)
        self._table_row(rec, replaced=bool(replaced))
        if not self._redraw_timer.isActive():
            self._redraw_timer.start()
        self.point_measured.emit(rec)

    def _table_row(self, rec: dict, replaced: bool) -> None:
        row = None
        if replaced:
            for r in range(self.table.rowCount()):
                if self.table.item(r, 0).text() == f"{rec['n']:,}" and self.table.item(r, 1).text() == rec["impl"]:
                    row = r
                    break
        if row is None:
            row = self.table.rowCount()
            self.table.insertRow(row)
        ok = rec["status"] == "ok"
        err = rec.get("rel_error")
        err_text = "reference" if rec["impl"] == "naive" and ok else (f"{err:.2e}" if err is not None else "–")
        if err is not None and rec.get("reference") not in (None, "naive"):
            err_text += f" (vs {rec['reference']})"
        cells = [f"{rec['n']:,}", rec["impl"],
                 f"{rec['ms']:.2f}" if ok else "–",
                 f"{rec['peak_bytes'] / 1e6:.2f}" if ok and rec.get("peak_bytes") is not None else "–",
                 err_text if ok else "–",
                 "" if ok else (rec.get("message") if rec["status"] == "skipped"
                                else f"failed: {rec.get('message') or 'unknown error'}")]
        for col, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if col in (0, 2, 3, 4):
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            if col == 1:
                item.setForeground(QBrush(QColor(COLOURS.get(rec["impl"], "#222"))))
            if not ok:
                item.setForeground(QBrush(QColor("#b00020")))
            self.table.setItem(row, col, item)
        self.table.scrollToItem(self.table.item(row, 0))

    def slopes(self) -> dict[str, dict[str, float | None]]:
        """Fitted log-log slopes per variant: {"chunked": {"time": 1.9, "memory": 1.0}, …}."""
        t, m = fit_slopes(self.points, "ms"), fit_slopes(self.points, "peak_bytes")
        return {impl: {"time": t[impl].p if t.get(impl) else None, "memory": m[impl].p if m.get(impl) else None}
                for impl in t.keys() | m.keys()}

    def _redraw(self) -> None:
        fits = self.slopes()
        for plot in (self.time_plot, self.memory_plot):
            plot.plotItem.legend.clear()
        for name, (t_curve, m_curve) in self.curves.items():
            pts = sorted((p for p in self.points if p["impl"] == name and p["status"] == "ok"), key=lambda p: p["n"])
            ns = [p["n"] for p in pts]
            t_curve.setData(ns, [p["ms"] for p in pts])
            mem = [(p["n"], p["peak_bytes"] / 1e6) for p in pts if p.get("peak_bytes")]
            m_curve.setData([a for a, _ in mem], [b for _, b in mem])
            if not pts:
                continue
            f = fits.get(name, {})
            t_label, m_label = name, name
            if f.get("time") is not None:
                t_label += f"  p = {f['time']:.2f}"
            if f.get("memory") is not None:
                m_label += f"  p = {f['memory']:.2f}"
            errs = [p for p in pts if p.get("rel_error") is not None]
            if name in APPROXIMATE and errs:
                t_label += f"  (error {errs[-1]['rel_error']:.2g} at n = {errs[-1]['n']:,})"
            self.time_plot.plotItem.legend.addItem(t_curve, t_label)
            if mem:
                self.memory_plot.plotItem.legend.addItem(m_curve, m_label)
        missed = [p for p in self.points if p["status"] != "ok" and p.get("predicted_bytes")]
        self.not_run.setData([p["n"] for p in missed], [p["predicted_bytes"] / 1e6 for p in missed])
        if missed:
            self.memory_plot.plotItem.legend.addItem(self.not_run, "not run (at its predicted need)")
        self._set_n_ticks()
        for plot in (self.time_plot, self.memory_plot):
            if self.points:
                plot.enableAutoRange()
            else:
                plot.setXRange(math.log10(N_MIN), math.log10(max(self.current_n, 2 * N_MIN)))
                plot.setYRange(-1, 3)  # 0.1 to 1000 (ms or MB)
        ok = [p for p in self.points if p["status"] == "ok"]
        for plot, ys in ((self.time_plot, [p["ms"] for p in ok]),
                         (self.memory_plot, [p["peak_bytes"] / 1e6 for p in ok if p.get("peak_bytes")]
                          + [p["predicted_bytes"] / 1e6 for p in missed])):
            ys = [y for y in ys if y and y > 0] or [0.1, 1000.0]
            plot.getAxis("left").setTicks(_value_ticks(min(ys), max(ys)))

    def _set_n_ticks(self) -> None:
        ns = [p["n"] for p in self.points] + [self.current_n] + ([] if self.points else [N_MIN])
        for plot in (self.time_plot, self.memory_plot):
            plot.getAxis("bottom").setTicks(_n_ticks(min(ns), max(ns)))
