"""The head page's "Go to token" box: a line edit for a token's number or a word, the line beside it that
names the token gone to (or says why there is none), and the view of the map centred on that token."""
from __future__ import annotations

import html

from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QWidget

GOTO_SPAN = 48  # most tokens on each axis after "Go to token" (fewer when the axis has no room to name them all)


def centred(pos: int, span: int, n: int) -> int:
    """The first of `span` tokens out of n with token `pos` in the middle, kept inside 0..n."""
    return min(max(0, pos - span // 2), max(0, n - span))


def view_around(pos: int, R: int, C: int, rows_fit: int, cols_fit: int
                ) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (x, y) ranges that centre row and column `pos` of an R×C map, at most GOTO_SPAN tokens a side
    and no more than each axis can label (rows_fit, cols_fit), so that every token shown has its label."""
    rows = min(GOTO_SPAN, R, rows_fit)
    cols = min(GOTO_SPAN, C, cols_fit)
    y0, x0 = centred(pos, rows, R), centred(pos, cols, C)
    return (x0, x0 + cols), (y0, y0 + rows)


class GoToBox(QWidget):
    """The box (`edit`) and the line beside it (`note`). The line names the token gone to until that token
    is gone (a new input); then the box forgets it too, so that box and line never disagree."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("Go to token (number or word)")
        self.edit.setToolTip("Type a token's number or a word and press Enter (Ctrl+G comes here): it becomes the "
                             "query and the map moves to it (a word: its next occurrence after the query)")
        self.edit.setMinimumWidth(200)
        self.edit.setMaximumWidth(240)
        self.note = QLabel("")
        self.at: int | None = None  # the token the line names (None: it names none)
        self._text = ""  # what the box said when it went there
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.edit)
        lay.addWidget(self.note, 1)

    def focus(self) -> None:
        """Ctrl+G: the box takes the keyboard, its text selected to be typed over."""
        self.edit.setFocus()
        self.edit.selectAll()

    def went_to(self, i: int, token: str) -> None:
        self.note.setText(f'token {i:,} "{html.escape(token)}"')
        self.at, self._text = i, self.edit.text()

    def failed(self, message: str) -> None:
        self.note.setText(f'<span style="color:#b00020">{html.escape(message, quote=False)}</span>')

    def forget(self) -> None:
        """The line names no token any more: the box loses what it went to (what the user is typing there
        stays)."""
        if self.at is not None and self.edit.text() == self._text:
            self.edit.clear()
        self.at, self._text = None, ""
        self.note.setText("")
