"""The analysis pages, in tab order: (name for --view, tab title, factory(state)).

Each page's module is imported when the window builds its page (plain imports, so import-linter sees them).
"""
from __future__ import annotations


def _overview(state):
    from attn_explorer.gui.analysis.overview import HeadOverviewPage

    return HeadOverviewPage(state)


def _rollout(state):
    from attn_explorer.gui.analysis.rollout import RolloutPage

    return RolloutPage(state)


def _norms(state):
    from attn_explorer.gui.analysis.norms import NormsPage

    return NormsPage(state)


def _search(state):
    from attn_explorer.gui.analysis.search import HeadSearchPage

    return HeadSearchPage(state)


def _compare(state):
    from attn_explorer.gui.analysis.compare import ComparePage

    return ComparePage(state)


def _lines(state):
    from attn_explorer.gui.analysis.lines import LinesPage

    return LinesPage(state)


def _corpus(state):
    from attn_explorer.gui.analysis.corpus import CorpusPage

    return CorpusPage(state)


def _custom(state):
    from attn_explorer.gui.analysis.custom import CustomAnalysisPage

    return CustomAnalysisPage(state)


ANALYSIS_PAGES = [
    ("overview", "Head overview", _overview),
    ("rollout", "Rollout", _rollout),
    ("norms", "Value norms", _norms),
    ("search", "Head search", _search),
    ("compare", "Compare", _compare),
    ("lines", "Lines", _lines),
    ("corpus", "Corpus", _corpus),
    ("custom", "Your analyses", _custom),  # ax.register_analysis(name, fn): one page, a chooser
]
