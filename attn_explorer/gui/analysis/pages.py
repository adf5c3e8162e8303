"""The analysis pages, in tab order: rows of the window's page table (widgets.pages.Page).

Each page's module is imported when the window builds its page (plain imports, so import-linter sees them).
"""
from __future__ import annotations

from attn_explorer.gui.widgets.pages import Page

GROUP = "Analyses"  # one top-level tab, each page a sub-tab in it


def _overview(state):
    from attn_explorer.gui.analysis.overview import HeadOverviewPage

    return HeadOverviewPage(state)


def _rollout(state):
    from attn_explorer.gui.analysis.rollout import RolloutPage

    return RolloutPage(state)


def _norms(state):
    from attn_explorer.gui.analysis.norms import NormsPage

    return NormsPage(state)


def _routing(state):
    from attn_explorer.gui.analysis.routing import RoutingPage

    return RoutingPage(state)


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


def _atlas(state):  # issue 27: every head over a corpus
    from attn_explorer.gui.analysis.atlas import AtlasPage

    return AtlasPage(state)


def _lab(state):  # issue 27 B: induction and retrieval heads, checked by ablation
    from attn_explorer.gui.analysis.lab import LabPage

    return LabPage(state)


def _custom(state):
    from attn_explorer.gui.analysis.custom import CustomAnalysisPage

    return CustomAnalysisPage(state)


ANALYSIS_PAGES: list[Page] = [
    Page("overview", "Head overview", _overview, GROUP),
    Page("rollout", "Rollout", _rollout, GROUP),
    Page("norms", "Value norms", _norms, GROUP),
    Page("search", "Head search", _search, GROUP),
    Page("routing", "Routing", _routing, GROUP),  # MoE models: each token's experts, layer by layer
    Page("compare", "Compare", _compare, GROUP),
    Page("lines", "Lines", _lines, GROUP),
    Page("corpus", "Corpus", _corpus, GROUP),
    Page("atlas", "Atlas", _atlas, GROUP),  # issue 27: every head over a corpus, two models matched
    Page("lab", "Lab", _lab, GROUP),  # issue 27 B: induction and retrieval heads, each checked by ablation
    Page("custom", "Your analyses", _custom, GROUP),  # ax.register_analysis(name, fn): one page, a chooser
]
