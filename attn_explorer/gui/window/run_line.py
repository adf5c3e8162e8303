"""The status bar's line for the run in flight (issue 24 D): what is running (model, tokens, layer k of L,
elapsed and an estimate, SessionState.run_status), a bar counting layers, and Stop (also Esc in the window:
the forward ends between layers, the last good view stays). Hidden while nothing runs. It reads plain numbers
from the session; the forward reports its layers from its own loop (core.progress), so nothing runs twice.

While nothing runs, the same place holds the bfloat16 offer (issue 24 B, session.bf16_offer): after a long float32
run on a CPU with native bfloat16, "bfloat16 would take about X s instead of Y s (…)" [Switch to bfloat16]. The
button goes through the toolbar's dtype picker, as a choice there does; nothing switches unless it is clicked."""
from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from attn_explorer.session.bf16_offer import Bf16Offer
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
        self.offer = Bf16Offer(state, self)
        self.offer_label = QLabel("")
        self.offer_label.setObjectName("bf16-offer")
        self.offer_label.setMinimumWidth(0)  # a narrow window elides it (its tooltip has it all), not the bar
        self.offer_button = QPushButton("Switch to bfloat16")
        self.offer_button.setObjectName("bf16-offer-switch")
        self.offer_button.clicked.connect(self.switch_to_bf16)
        self.offer.changed.connect(lambda *_: self.refresh())
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.label)
        lay.addWidget(self.bar)
        lay.addWidget(self.stop_button)
        lay.addWidget(self.offer_label, 1)
        lay.addWidget(self.offer_button)
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

    def switch_to_bf16(self) -> None:
        """The offer's button: bfloat16 in the dtype picker, as if chosen there (the picker reloads the model)."""
        toolbar = getattr(self.window(), "toolbar", None)
        if toolbar is not None and hasattr(toolbar, "choose_dtype"):
            toolbar.choose_dtype("bfloat16")
        else:
            self.state.set_dtype("bfloat16")

    def _show_running(self, on: bool) -> None:
        for w in (self.label, self.bar, self.stop_button):
            w.setVisible(on)

    def _show_offer(self, line: str) -> None:
        on = bool(line)
        self.offer_label.setText(line)
        self.offer_label.setToolTip(self.offer.tip)
        self.offer_button.setToolTip(self.offer.tip)
        self.offer_label.setVisible(on)
        self.offer_button.setVisible(on)

    def refresh(self) -> None:
        s = self.state.run_status() if self.state.busy else None
        if s is None:
            self._tick.stop()
            self._show_running(False)
            self._show_offer("" if self.state.busy else self.offer.line)
            self.setVisible(self.offer_label.isVisibleTo(self))
            return
        self._show_offer("")
        self._show_running(True)
        self.label.setText(self.state.watch.line())
        self.bar.setRange(0, max(1, s["layers"]))
        self.bar.setValue(s["layer"])
        if not self._tick.isActive():
            self._tick.start()
        self.show()
