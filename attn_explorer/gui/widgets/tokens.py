"""How a token is written on screen, and the box that takes one back.

A tokenizer's " Mary" and "Mary" are two tokens; drawn as they are, both read "Mary". `token_text` draws
the white space (␣ space, ↵ newline, ⇥ tab, ∅ the empty token), so every bar, cell and list shows the token
a user would type; `token_from_text` reads such a text back into the token. `TokenPicker` is the editable
list of likely tokens that the pages taking a target token share: picking " Mary" gives " Mary".
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QWidget

SYMBOLS = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
EMPTY = "∅"


def token_text(token: str, width: int | None = None) -> str:
    """A token with its white space drawn (' Mary' -> '␣Mary', '\\n' -> '↵'), cut to `width` characters."""
    # a byte-level tokenizer's newline ('Ċ') reaches the views as the two characters backslash-n (hub.text)
    t = "".join(SYMBOLS.get(c, c) for c in token.replace("\\n", "\n")) or EMPTY
    if width is not None and len(t) > width:
        t = t[: width - 1] + "…"
    return t


def token_from_text(text: str) -> str:
    """The token a shown text stands for: '␣Mary' -> ' Mary' (the inverse of token_text, uncut)."""
    if text == EMPTY:
        return ""
    for raw, shown in SYMBOLS.items():
        text = text.replace(shown, raw)
    return text


class TokenPicker(QComboBox):
    """An editable list of tokens, shown as `token_text` draws them; `text()` is the exact token picked or
    typed ('␣Mary' and ' Mary' both give ' Mary'), "" when the box is empty.

    Keeps QLineEdit's small API (`text`, `setText`, `returnPressed`, `setPlaceholderText`) so a page can
    swap one for the other."""

    returnPressed = Signal()  # noqa: N815 - QLineEdit's name

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setEditable(True)
        self.setInsertPolicy(QComboBox.NoInsert)  # Enter measures; it does not add to the list
        self.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(8)
        self.lineEdit().returnPressed.connect(self.returnPressed)

    def set_tokens(self, tokens: list[str], shown: list[str] | None = None) -> None:
        """Offer these tokens (most likely first), written as `token_text` draws them unless `shown` gives
        the texts (a classifier's class names); what is typed in the box stays."""
        typed = self.currentText()
        self.blockSignals(True)
        try:
            super().clear()
            for t, text in zip(tokens, shown or [token_text(t) for t in tokens]):
                self.addItem(text, t)
            self.setCurrentIndex(-1)
            self.setEditText(typed)
        finally:
            self.blockSignals(False)

    def tokens(self) -> list[str]:
        return [self.itemData(i) for i in range(self.count())]

    def text(self) -> str:
        shown = self.currentText()
        i = self.findText(shown)
        return self.itemData(i) if i >= 0 else token_from_text(shown)

    def setText(self, text: str) -> None:  # noqa: N802 - QLineEdit's name
        self.setEditText(token_text(text) if text else "")

    def setPlaceholderText(self, text: str) -> None:  # noqa: N802 - QLineEdit's name
        self.lineEdit().setPlaceholderText(text)

    def clear(self) -> None:
        """The list and the typed text go (a new model: its tokens are another vocabulary's)."""
        super().clear()
        self.setEditText("")
