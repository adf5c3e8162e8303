"""The status bar's line for the run in flight (issue 24 D): what is running (model, tokens, layer k of L,
elapsed and an estimate, SessionState.run_status), a bar counting layers, and Stop (also Esc in the window:
the forward ends between layers, the last good view stays). Hidden while nothing runs. It reads plain numbers
from the session; the forward reports its layers from its own loop (core.progress), so nothing runs twice."""
from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from attn_explorer.session.live_run import incomplete
from attn_explorer.session.state import SessionState


class RunLine(QWidget):
    """"running gemma3-270m: 28,252 tokens, layer 7 of 18 · 41 s, about 65 s left" [=====    ] [Stop]."""

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.label = QLabel("")
        self.bar = QProgressBar()
        self.bar.setMaximumWidth(160)
        self.bar.setFormat("layer %v of %m")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the run (Esc): the maps on screen stay")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.label)
        lay.addWidget(self.bar)
        lay.addWidget(self.stop_button)
        self._tick = QTimer(self)  # the elapsed time moves on between layers too
        self._tick.setInterval(500)
        self._tick.timeout.connect(self.refresh)
        self.stop_button.clicked.connect(self.stop)
        state.run_progressed.connect(lambda *_: self.refresh())
        state.busy_changed.connect(lambda *_: self.refresh())
        state.attention_ready.connect(lambda *_: self.refresh())
        self.hide()

    def stop(self) -> None:
        if self.state.run_status() is not None:
            self.state.stop_run()
            kept = incomplete(self.state.result)  # a long run's finished layers stay (issue 24 C)
            self.state.error_raised.emit(f"stopped: the layers done stay on screen ({kept})" if kept
                                         else "stopped: the maps on screen are still the previous input's")
        self.refresh()

    def refresh(self) -> None:
        s = self.state.run_status() if self.state.busy else None
        if s is None:
            self._tick.stop()
            self.hide()
            return
        self.label.setText(self.state.watch.line())
        self.bar.setRange(0, max(1, s["layers"]))
        self.bar.setValue(s["layer"])
        if not self._tick.isActive():
            self._tick.start()
        self.show()
