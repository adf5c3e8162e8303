"""The tab bar stays readable at 1024 px: the analysis pages share one "Analyses" tab of sub-tabs,
and every page is still reachable by name (--view, the View menu, head clicks)."""
from __future__ import annotations

from PySide6.QtWidgets import QTabWidget

from attn_explorer.gui.analysis.pages import ANALYSIS_PAGES


def test_analysis_pages_share_one_tab(make_window, qtbot):
    w = make_window(model="textbook")
    titles = [w.tabs.tabText(i) for i in range(w.tabs.count())]
    assert titles.count("Analyses") == 1
    # eight tabs plus Interventions (its tools' sub-tabs); test_window's every-tab-visible test checks they fit 1024 px
    assert w.tabs.count() <= 9, titles
    for row in ANALYSIS_PAGES:
        assert row.name in w.pages
        assert row.title not in titles  # a sub-tab, not a top-level tab


def test_show_page_opens_a_sub_tab_and_names_it(make_window, qtbot):
    w = make_window(model="textbook")
    name = ANALYSIS_PAGES[-1].name
    w.show_page(name)
    outer = w.tabs.currentWidget()
    assert isinstance(outer, QTabWidget) and w.tabs.tabText(w.tabs.currentIndex()) == "Analyses"
    assert outer.currentWidget() is w._tab_of[name]
    assert w.current_page_name == name
    w.show_page("head")
    assert w.current_page_name == "head"
    w.show_page(ANALYSIS_PAGES[0].name)
    assert w.current_page_name == ANALYSIS_PAGES[0].name
