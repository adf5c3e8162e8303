"""The Lessons page: a list of the primer's lessons on the left, the chosen lesson on the right.

Each lesson is a module here named after it ("by-hand" -> `by_hand.py`) that defines its page, a QWidget
named after it too (`ByHandLesson(state)`), listed in `LESSON_CLASSES`. `LESSON_PAGES` are the lessons'
rows of the window's page table (widgets.pages.Page, group "Lessons"): `--lesson` and `show_page` find a
lesson there. Pages are built the first time they are shown, so the window does not pay for them at start.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QStackedWidget, QWidget
from superqt.utils import signals_blocked

from attn_explorer.gui.widgets.pages import Page
from attn_explorer.session.lesson_list import LESSONS
from attn_explorer.session.state import SessionState

LESSONS_GROUP = "Lessons"  # the Lessons tab: its pages are listed on its left, not sub-tabs


def _by_hand():
    from attn_explorer.gui.lessons.by_hand import ByHandLesson

    return ByHandLesson


def _inside_a_head():
    from attn_explorer.gui.lessons.inside_a_head import InsideAHeadLesson

    return InsideAHeadLesson


def _projections():
    from attn_explorer.gui.lessons.projections import ProjectionsLesson

    return ProjectionsLesson


def _multi_head():
    from attn_explorer.gui.lessons.multi_head import MultiHeadLesson

    return MultiHeadLesson


def _order():
    from attn_explorer.gui.lessons.order import OrderLesson

    return OrderLesson


def _scaling():
    from attn_explorer.gui.lessons.scaling import ScalingLesson

    return ScalingLesson


def _block():
    from attn_explorer.gui.lessons.block import BlockLesson

    return BlockLesson


def _coreference():
    from attn_explorer.gui.lessons.coreference import CoreferenceLesson

    return CoreferenceLesson


def _train_vit():
    from attn_explorer.gui.lessons.train_vit import TrainViTLesson

    return TrainViTLesson


def _no_softmax():
    from attn_explorer.gui.lessons.no_softmax import NoSoftmaxLesson

    return NoSoftmaxLesson


# lesson name -> its page's class, imported when asked (plain imports, so import-linter sees them)
LESSON_CLASSES: dict[str, Callable[[], type[QWidget]]] = {
    "by-hand": _by_hand,
    "inside-a-head": _inside_a_head,
    "projections": _projections,
    "multi-head": _multi_head,
    "order": _order,
    "scaling": _scaling,
    "block": _block,
    "coreference": _coreference,
    "train-vit": _train_vit,
    "no-softmax": _no_softmax,
}


def page_class(name: str) -> type[QWidget]:
    """The page of lesson `name`, imported now (a lesson page imports `session.lessons`, and with it torch)."""
    return LESSON_CLASSES[name]()


def _factory(name: str) -> Callable[[SessionState], QWidget]:
    return lambda state: page_class(name)(state)


# the lessons' rows of the window's page table, in the primer's order (session.lesson_list)
LESSON_PAGES: tuple[Page, ...] = tuple(Page(name, title, _factory(name), LESSONS_GROUP)
                                       for name, title in LESSONS.items())


class LessonsPage(QWidget):
    """All lessons in one tab. `show_lesson(name)` opens one; `lesson_shown(name)` says which."""

    lesson_shown = Signal(str)

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.rows = {p.name: p for p in LESSON_PAGES}
        self.names = list(self.rows)
        self.pages: dict[str, QWidget] = {}
        self.nav = QListWidget()
        self.nav.addItems([p.title for p in self.rows.values()])
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
                page = self.rows[name].factory(self.state)
            except Exception as exc:  # noqa: BLE001 - one broken lesson must not break the others
                page = QLabel(f"This lesson failed to start: {type(exc).__name__}: {exc}")
                page.setWordWrap(True)
            page.setObjectName(f"lesson-{name}")
            self.pages[name] = page
            self.stack.addWidget(page)
        return self.pages[name]

    def show_lesson(self, name: str) -> QWidget:
        if name not in self.rows:
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
