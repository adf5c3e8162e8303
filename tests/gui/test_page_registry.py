"""One page table (gui/window/pages.PAGES) registers every page of the window: the window's tabs, the
View menu, --lesson and show_page all read it, and each lesson's page has a name of its own."""
from __future__ import annotations

import argparse

import pytest

from attn_explorer.errors import UserError
from attn_explorer.gui.lessons import LESSON_CLASSES, LESSONS_GROUP
from attn_explorer.gui.window.pages import LESSON_NAMES, PAGES
from attn_explorer.session.lesson_list import LESSONS


def test_every_page_has_one_row_and_every_lesson_a_page_class_of_its_own():
    names = [p.name for p in PAGES]
    assert len(names) == len(set(names)), names
    assert list(LESSON_NAMES) == list(LESSONS)  # the primer's order, every lesson listed
    assert set(LESSON_CLASSES) == set(LESSONS)
    classes = [load() for load in LESSON_CLASSES.values()]
    assert len({c.__name__ for c in classes}) == len(classes)  # no nine classes called LessonPage
    assert all(c.__name__.endswith("Lesson") for c in classes), [c.__name__ for c in classes]


def test_the_window_builds_its_tabs_from_the_table_and_opens_a_lesson_by_name(make_window, qtbot):
    w = make_window(model="textbook")
    tabs = [w.tabs.tabText(i) for i in range(w.tabs.count())]
    for row in PAGES:
        if row.group == LESSONS_GROUP:
            assert row.name not in w.pages  # built when first shown, not with the window
        else:
            assert row.name in w.pages
            assert (row.group or row.title) in tabs
    view_menu = next(a.menu() for a in w.menuBar().actions() if a.text() == "&View")
    assert [a.text() for a in view_menu.actions()[:len(w.pages)]] == [p.title for p in PAGES if p.name in w.pages]
    w.show_page("scaling")
    lessons = w.pages["lessons"]
    assert w.current_page_name == "lessons" and lessons.current_lesson == "scaling"
    assert type(lessons.pages["scaling"]).__name__ == "ScalingLesson"
    with pytest.raises(KeyError):
        w.open_lesson("grid")


def test_lesson_on_the_command_line_opens_it_and_an_unknown_one_is_one_line(qtbot, settings):
    from attn_explorer.gui.window.app import build_window, get_qapp
    from tests.gui.conftest import cached_loader

    get_qapp()

    def args(lesson):
        return argparse.Namespace(model="textbook", text=None, image=None, device="cpu", view=None, screenshot=None,
                                  lesson=lesson)

    with pytest.raises(UserError, match="unknown lesson 'nope': choose from by-hand, inside-a-head"):
        build_window(args("nope"), settings=settings, loader=cached_loader)
    window, state = build_window(args("order"), settings=settings, loader=cached_loader)
    qtbot.addWidget(window)
    try:
        assert window.current_page_name == "lessons"
        assert window.pages["lessons"].current_lesson == "order"
        assert type(window.pages["lessons"].pages["order"]).__name__ == "OrderLesson"
    finally:
        state.shutdown()
