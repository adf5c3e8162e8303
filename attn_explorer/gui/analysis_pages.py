"""The analysis pages, in tab order: (name for --view, tab title, factory(state)).

Each page's module is imported when the window builds it, so one broken page only breaks its own tab.
"""
from __future__ import annotations

import importlib


def _page(module: str, cls: str):
    def make(state):
        return getattr(importlib.import_module(f"attn_explorer.gui.{module}"), cls)(state)

    return make


ANALYSIS_PAGES = [
    ("overview", "Head overview", _page("analysis_overview", "HeadOverviewPage")),
    ("rollout", "Rollout", _page("analysis_rollout", "RolloutPage")),
    ("norms", "Value norms", _page("analysis_norms", "NormsPage")),
    ("search", "Head search", _page("analysis_search", "HeadSearchPage")),
    ("compare", "Compare", _page("analysis_compare", "ComparePage")),
    ("lines", "Lines", _page("analysis_lines", "LinesPage")),
]
