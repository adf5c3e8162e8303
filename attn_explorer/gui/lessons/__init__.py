"""The Lessons page: a list of the primer's lessons on the left, the chosen lesson on the right.

Each lesson is a module here named after it ("by-hand" -> `by_hand.py`) that defines `LessonPage(state)`,
a QWidget. Pages are built the first time they are shown, so the window does not pay for them at start.
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QStackedWidget, QWidget
from superqt.utils import signals_blocked

from attn_explorer.session.lesson_list import LESSONS
from attn_explorer.session.state import SessionState


def page_class(name: str) -> type[QWidget]:
    """The page of lesson `name`, imported now (a lesson page imports `session.lessons`, and with it torch)."""
    if name == "by-hand":
        from attn_explorer.gui.lessons.by_hand import LessonPage
    elif name == "inside-a-head":
        from attn_explorer.gui.lessons.inside_a_head import LessonPage
    elif name == "projections":
        from attn_explorer.gui.lessons.projections import LessonPage
    elif name == "multi-head":
        from attn_explorer.gui.lessons.multi_head import LessonPage
    elif name == "order":
        from attn_explorer.gui.lessons.order import LessonPage
    elif name == "scaling":
        from attn_explorer.gui.lessons.scaling import LessonPage
    elif name == "block":
        from attn_explorer.gui.lessons.block import LessonPage
    elif name == "coreference":
        from attn_explorer.gui.lessons.coreference import LessonPage
    elif name == "train-vit":
        from attn_explorer.gui.lessons.train_vit import LessonPage
    else:
        raise KeyError(name)
    return LessonPage


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
        with signals_blocked(self.nav):
            self.nav.setCurrentRow(0)  # chosen, not built: lessons import torch, and the window must show first
        self.nav.currentRowChanged.connect(lambda row: self.show_lesson(self.names[row]) if row >= 0 else None)

    def showEvent(self, ev):  # noqa: N802 - Qt API
        super().showEvent(ev)
        if self.stack.count() == 0:  # first time the tab is shown: build the chosen lesson now
            self.show_lesson(self.current_lesson)

    def page(self, name: str) -> QWidget:
        """The lesson's page, built on first use (a page that fails to build says why, in its place)."""
        if name not in self.pages:
            try:
                page = page_class(name)(self.state)
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
            with signals_blocked(self.nav):
                self.nav.setCurrentRow(row)
        self.lesson_shown.emit(name)
        return page

    @property
    def current_lesson(self) -> str:
        return self.names[self.nav.currentRow()]
