"""The window's error banner: one non-blocking, dismissable line over the pages (the last good view stays)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget


class Banner(QFrame):
    """A non-blocking, dismissable error line at the top of the window."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.setStyleSheet("#banner { background: #fdecea; border: 1px solid #f5c2c0; border-radius: 4px; }"
                           "QLabel { color: #8a1c1c; }")
        self.label = QLabel("")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setToolTip("Dismiss")
        self.close_button.setAutoRaise(True)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 4, 4, 4)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.close_button)
        self.close_button.clicked.connect(self.hide)
        self.hide()

    def show_message(self, text: str) -> None:
        self.label.setText(f"⚠ {text}")
        self.show()

    @property
    def text(self) -> str:
        return self.label.text()
