"""The Lessons page: a list of the primer's lessons on the left, the chosen lesson on the right.

Each lesson is a module here named after it ("by-hand" -> `by_hand.py`) that defines `LessonPage(state)`,
a QWidget. Pages are built the first time they are shown, so the window does not pay for them at start.
"""
from __future__ import annotations

import importlib

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QStackedWidget, QWidget

from attn_explorer.session.lessons import LESSONS
from attn_explorer.session.state import SessionState


def lesson_module(name: str) -> str:
    return f"{__name__}.{name.replace('-', '_')}"


class LessonsPage(QWidget):
    """All lessons in one tab. `show_lesson(name)` opens one; `lesson_shown(name)` says which."""

    lesson_shown = Signal(str)

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.names = list(LESSONS)
        self.pages: dict[str, QWidget] = {}
        self.nav = QListWidget()
        self.nav.addItems([LESSONS[n] for n in self.names])
        self.nav.setFixedWidth(self.nav.sizeHintForColumn(0) + 24)
        self.stack = QStackedWidget()
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.nav)
        lay.addWidget(self.stack, 1)
        self.nav.blockSignals(True)
        self.nav.setCurrentRow(0)  # chosen, not built: lessons import torch, and the window must show first
        self.nav.blockSignals(False)
        self.nav.currentRowChanged.connect(lambda row: self.show_lesson(self.names[row]) if row >= 0 else None)

    def showEvent(self, ev):  # noqa: N802 - Qt API
        super().showEvent(ev)
        if self.stack.count() == 0:  # first time the tab is shown: build the chosen lesson now
            self.show_lesson(self.current_lesson)

    def page(self, name: str) -> QWidget:
        """The lesson's page, built on first use (a page that fails to build says why, in its place)."""
        if name not in self.pages:
            try:
                page = importlib.import_module(lesson_module(name)).LessonPage(self.state)
            except Exception as exc:  # noqa: BLE001 - one broken lesson must not break the others
                page = QLabel(f"This lesson failed to start: {type(exc).__name__}: {exc}")
                page.setWordWrap(True)
            page.setObjectName(f"lesson-{name}")
            self.pages[name] = page
            self.stack.addWidget(page)
        return self.pages[name]

    def show_lesson(self, name: str) -> QWidget:
        if name not in LESSONS:
            raise KeyError(name)
        page = self.page(name)
        self.stack.setCurrentWidget(page)
        row = self.names.index(name)
        if self.nav.currentRow() != row:
            self.nav.blockSignals(True)
            self.nav.setCurrentRow(row)
            self.nav.blockSignals(False)
        self.lesson_shown.emit(name)
        return page

    @property
    def current_lesson(self) -> str:
        return self.names[self.nav.currentRow()]
