"""The frame every analysis and intervention page is built in, and the progress line of its worker job.

`PageFrame`, top to bottom: a caption (what the page shows), a note naming the window's drawing options this
page does not use (`UnusedNote`), the page's rows of controls, one progress line with Cancel (`JobProgress`),
the canvas area (a `CanvasStack`: the page's content, or one centred message in its place) and a read-out
line. Its signals: `head_opened(layer, head)` when the user asks to see a head, `failed(message)` when the
page's job failed (the frame hands the message to the window's banner). Pages subclass it.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QLayout, QProgressBar, QPushButton, QSizePolicy, QVBoxLayout,
                               QWidget)

from attn_explorer.gui.widgets.heatmap import CanvasStack, LazyPage, PaintedGraphicsWidget

FAILED = "This page could not be drawn: the message at the top of the window says why."
STEPS = 1000  # the bar's resolution for a job that reports fractions


class JobProgress(QWidget):
    """One line for a page's worker job: what it does, how far it got, and Cancel (or, after a cancel, a
    button that starts it again, or only a line saying so). Hidden while no job runs and nothing is said."""

    cancel_asked = Signal()  # the user pressed Cancel while the job ran
    restart_asked = Signal()  # the user pressed the start-again button after a cancel

    def __init__(self, again: str | None = "Start again", parent: QWidget | None = None):
        super().__init__(parent)
        self.label = QLabel("")
        self.label.setWordWrap(True)
        self.bar = QProgressBar()
        self.bar.setRange(0, STEPS)
        self.bar.setFormat("%p%")
        self.bar.setMaximumWidth(260)
        # tall enough for its text ("Logit lens 40%"), whatever the row's other controls ask for
        self.bar.setMinimumHeight(self.bar.fontMetrics().height() + 8)
        self.button = QPushButton("Cancel")
        self._again = again
        self.running = False
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.bar)
        lay.addWidget(self.button)
        self.button.clicked.connect(self._clicked)
        self.hide()

    @property
    def fraction(self) -> float:
        return self.bar.value() / max(1, self.bar.maximum())

    def start(self, text: str, fmt: str = "%p%", total: int | None = None) -> None:
        """A job began: its description, the bar at 0 (of `total` steps, or of a fraction) and Cancel."""
        self.running = True
        self.label.setText(text)
        self.bar.setRange(0, STEPS if total is None else max(1, int(total)))
        self.bar.setFormat(fmt)
        self.bar.setValue(0)
        self.bar.setToolTip("")
        self.bar.show()
        self.button.setText("Cancel")
        self.button.show()
        self.show()

    def advance(self, fraction: float, message: str = "", say: bool = False) -> None:
        """How far the job got (0 to 1); its message in the bar's tooltip, or in the line when `say`."""
        if not self.running:
            return  # a report that was on its way when the job was stopped
        self.bar.setValue(int(round(max(0.0, min(1.0, fraction)) * self.bar.maximum())))
        if message:
            (self.label.setText if say else self.bar.setToolTip)(message)

    def count(self, done: int, total: int) -> None:
        """How far a job that counts its steps got: done of total."""
        if not self.running:
            return
        self.bar.setMaximum(max(1, int(total)))
        self.bar.setValue(int(done))

    def finish(self, text: str = "") -> None:
        """The job's answer arrived: the bar goes (its value stays the last one reported); `text` stays, if any."""
        self.running = False
        if text:
            self.say(text)
        else:
            self.hide()

    def stopped(self, text: str) -> None:
        """The job was cancelled: say so, and offer to start it again where the page can."""
        self.running = False
        self.say(text)
        if self._again:
            self.button.setText(self._again)
            self.button.show()

    def say(self, text: str) -> None:
        """Only a line: no bar, no button."""
        self.label.setText(text)
        self.bar.hide()
        self.button.hide()
        self.show()

    def _clicked(self) -> None:
        (self.cancel_asked if self.running else self.restart_asked).emit()


class UnusedNote(QLabel):
    """One small line saying which of the window's drawing options ("Scale: log", "Hide specials") this page
    does not use, and why; shown only while such an option is on, so no control is silently ignored."""

    def __init__(self, state, hide: str | None = None, log: str | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.reasons = {"hide": hide, "log": log}
        self.setWordWrap(True)
        self.setStyleSheet("color: #666; font-style: italic;")
        state.options_changed.connect(self.update_text)
        self.update_text()

    def set_reasons(self, hide: str | None = None, log: str | None = None) -> None:
        self.reasons = {"hide": hide, "log": log}
        self.update_text()

    def update_text(self) -> None:
        parts = []
        if self.state.log_scale and self.reasons["log"]:
            parts.append(f"Log scale: not used here — {self.reasons['log']}.")
        if self.state.hide_special and self.reasons["hide"]:
            parts.append(f"Hide specials: not used here — {self.reasons['hide']}.")
        self.setText(" ".join(parts))
        self.setVisible(bool(parts))


class PageFrame(LazyPage, QWidget):
    """A page: caption, unused-options note, rows of controls (`control_row` is the first), the job's progress line,
    the canvas area (`stack` holds the content, or a message in its place) and the read-out."""

    head_opened = Signal(int, int)  # layer, head: the user asked to see that head
    failed = Signal(str)  # the page's job failed: one line, shown in the window's banner

    def __init__(self, state, content: QWidget | None = None, parent: QWidget | None = None, *,
                 message: str = "Loading the model…", again: str | None = None, fill_height: int | None = None,
                 rich: bool = False, mono_readout: bool = True):
        """`content`: the canvas area's widget (None: a pyqtgraph canvas); `message`: what it says until the page
        draws; `again`: the progress line's start-again button after a cancel (None: none); `fill_height`: the
        content takes only the height the window has, at least this much (a page that scrolls hides its axis);
        `rich`: caption and read-out are HTML; `mono_readout`: numbers in a fixed-width read-out."""
        super().__init__(parent)
        self.state = state
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        self.note = UnusedNote(state)
        self.controls = QVBoxLayout()  # the page's rows of controls
        self.controls.setSpacing(4)
        self.control_row = QHBoxLayout()
        self.controls.addLayout(self.control_row)
        self.progress = JobProgress(again)
        self.progress.cancel_asked.connect(self.cancel)
        self.progress.restart_asked.connect(self.restart)
        if content is None:  # a page drawn with pyqtgraph: `canvas` is its GraphicsLayoutWidget
            content = self.canvas = PaintedGraphicsWidget()
        self.stack = CanvasStack(content, message)  # stack.canvas: the content
        if fill_height is not None:
            self.stack.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Ignored)
            self.stack.setMinimumHeight(fill_height)
        self.readout = QLabel("")
        if rich:
            self.caption.setTextFormat(Qt.RichText)
            self.readout.setTextFormat(Qt.RichText)
        if mono_readout:
            self.readout.setStyleSheet("font-family: monospace;")
        else:
            self.readout.setWordWrap(True)
        self.page_layout = QVBoxLayout(self)
        self.page_layout.setContentsMargins(4, 4, 4, 4)
        for w in (self.caption, self.note):
            self.page_layout.addWidget(w)
        self.page_layout.addLayout(self.controls)
        self.page_layout.addWidget(self.progress)
        self.page_layout.addWidget(self.stack, 1)
        self.page_layout.addWidget(self.readout)
        self.failed.connect(state.error_raised)

    def add_row(self, row) -> None:
        """Another row of controls (a layout or a widget) under the ones before it."""
        (self.controls.addLayout if isinstance(row, QLayout) else self.controls.addWidget)(row)

    def add_side(self, side, stretch: tuple[int, int] = (1, 0)) -> None:
        """A panel (a layout or a widget: a list, a table) beside the canvas area, sharing its height."""
        i = self.page_layout.indexOf(self.stack)
        self.page_layout.removeWidget(self.stack)
        body = QHBoxLayout()
        body.addWidget(self.stack, stretch[0])
        (body.addLayout if isinstance(side, QLayout) else body.addWidget)(side, stretch[1])
        self.page_layout.insertLayout(i, body, 1)

    def unused_note(self, hide: str | None = None, log: str | None = None) -> None:
        """Why this page does not use "Hide specials" (hide) or "Scale: log" (log); None: it uses it."""
        self.note.set_reasons(hide, log)

    def show_failure(self, message: str) -> None:
        """A job failed: the caption and read-out described what is gone; the message goes to the banner, once,
        and the canvas points there."""
        self.caption.setText("")
        self.readout.setText("")
        self.stack.show_message(FAILED)
        self.failed.emit(message)

    def cancel(self) -> None:
        """The progress line's Cancel: pages with a job stop it here."""

    def restart(self) -> None:
        """The progress line's start-again button: pages that offer one start their job again here."""

    def open_head(self, layer: int, head: int) -> None:
        self.state.select(layer, head)
        self.head_opened.emit(int(layer), int(head))
