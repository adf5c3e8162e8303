"""The status bar's line for the run in flight (issue 24 D): what is running (model, tokens, layer k of L,
elapsed and an estimate, SessionState.run_status), a bar counting layers, and Stop (also Esc in the window:
the forward ends between layers, the last good view stays). Hidden while nothing runs. It reads plain numbers
from the session; the forward reports its layers from its own loop (core.progress), so nothing runs twice.

While nothing runs, the same place holds the bfloat16 offer (issue 24 B, session.bf16_offer): after a long float32
run on a CPU with native bfloat16, "bfloat16 would take about X s instead of Y s (…)" [Switch to bfloat16]. The
button goes through the toolbar's dtype picker, as a choice there does; nothing switches unless it is clicked."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QSizePolicy, QWidget

from attn_explorer.session.bf16_offer import Bf16Offer
from attn_explorer.session.live_run import incomplete
from attn_explorer.session.state import SessionState


class OfferBox(QWidget):
    """The bfloat16 offer: its line and the switch, side by side. Given the line's ways of saying it (longest first)
    it shows the longest that fits with the button's full text, else with a short "Switch", else the shortest
    elided: a crowded status bar squeezes it, and the tooltip always has all of it."""

    BUTTON_TEXTS = ("Switch to bfloat16", "Switch")

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.variants: tuple[str, ...] = ()
        self._button_ws: dict[str, int] = {}
        self.label = QLabel("")
        self.label.setObjectName("bf16-offer")
        self.button = QPushButton(self.BUTTON_TEXTS[0])
        self.button.setObjectName("bf16-offer-switch")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.label)
        lay.addWidget(self.button)
        lay.addStretch(1)  # the button right after its line, not at the far end of a wide bar
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)

    def set_offer(self, variants, tip: str) -> None:
        self.variants = tuple(variants)
        for w in (self.label, self.button):
            w.setToolTip(tip)
        self.updateGeometry()
        self._fit()

    def _text_w(self, text: str) -> int:
        return self.label.fontMetrics().horizontalAdvance(text) + 4

    def _button_w(self, text: str) -> int:
        """The button's width with `text`: measured once per text (a short text may keep a minimum width)."""
        if text not in self._button_ws:
            shown = self.button.text()
            self.button.setText(text)
            self._button_ws[text] = self.button.sizeHint().width()
            self.button.setText(shown)
        return self._button_ws[text]

    def _need(self, variant: str, button: str) -> int:
        return self._text_w(variant) + self.layout().spacing() + self._button_w(button)

    def sizeHint(self) -> QSize:
        h = super().sizeHint()
        return QSize(self._need(self.variants[0], self.BUTTON_TEXTS[0]), h.height()) if self.variants else h

    def minimumSizeHint(self) -> QSize:
        h = super().minimumSizeHint()
        return QSize(self._need(self.variants[-1], self.BUTTON_TEXTS[-1]), h.height()) if self.variants else h

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        if not self.variants:
            self.label.setText("")
            return
        room = self.width()
        for button in self.BUTTON_TEXTS:
            for v in self.variants:
                if self._need(v, button) <= room:
                    self.button.setText(button)
                    self.label.setText(v)
                    return
        button = self.BUTTON_TEXTS[-1]
        self.button.setText(button)
        left = max(0, room - self._need("", button))
        self.label.setText(self.label.fontMetrics().elidedText(self.variants[-1], Qt.ElideRight, left))


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
        self.offer_box = OfferBox()  # a narrow window gets a shorter line; the tooltip has all of it
        self.offer_label, self.offer_button = self.offer_box.label, self.offer_box.button
        self.offer_button.clicked.connect(self.switch_to_bf16)
        self.offer.changed.connect(lambda *_: self.refresh())
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.label)
        lay.addWidget(self.bar)
        lay.addWidget(self.stop_button)
        lay.addWidget(self.offer_box, 1)
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
        self.offer_box.set_offer(self.offer.variants if on else (), self.offer.tip if on else "")
        self.offer_box.setVisible(on)

    def refresh(self) -> None:
        s = self.state.run_status() if self.state.busy else None
        if s is None:
            self._tick.stop()
            self._show_running(False)
            self._show_offer("" if self.state.busy else self.offer.line)
            self.setVisible(self.offer_box.isVisibleTo(self))
            return
        self._show_offer("")
        self._show_running(True)
        self.label.setText(self.state.watch.line())
        self.bar.setRange(0, max(1, s["layers"]))
        self.bar.setValue(s["layer"])
        if not self._tick.isActive():
            self._tick.start()
        self.show()
