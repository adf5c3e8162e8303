"""One line for a long analysis job: what it does, how far it got, and a button to stop it (or start it again).

The analysis pages run their long-input jobs (statistics or rollout computed in tiles from q and k) in a
worker; this bar is how the user sees them move and stops one. After a cancel it says so and offers to
start again, so a page never looks finished when it is not.
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget


class JobProgress(QWidget):
    cancel_asked = Signal()  # the user pressed Cancel while the job ran
    restart_asked = Signal()  # the user pressed Start again after a cancel

    def __init__(self, again: str = "Start again", parent: QWidget | None = None):
        super().__init__(parent)
        self.label = QLabel("")
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setFormat("%p%")
        self.bar.setMaximumWidth(260)
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
        return self.bar.value() / 1000.0

    def start(self, text: str) -> None:
        """A job began: its description, the bar at 0 and Cancel."""
        self.running = True
        self.label.setText(text)
        self.bar.setValue(0)
        self.bar.show()
        self.button.setText("Cancel")
        self.show()

    def advance(self, fraction: float, message: str = "") -> None:
        if not self.running:
            return  # a report that was on its way when the job was stopped
        self.bar.setValue(int(round(max(0.0, min(1.0, fraction)) * 1000)))
        if message:
            self.bar.setToolTip(message)

    def finish(self) -> None:
        """The job's answer arrived: the bar goes (its value stays the last one reported)."""
        self.running = False
        self.hide()

    def stopped(self, text: str) -> None:
        """The job was cancelled: say so, and offer to start it again."""
        self.running = False
        self.label.setText(text)
        self.bar.hide()
        self.button.setText(self._again)
        self.show()

    def _clicked(self) -> None:
        (self.cancel_asked if self.running else self.restart_asked).emit()
