"""The Interventions tab's pages, in tab order: rows of the window's page table (widgets.pages.Page).

Each page's module is imported when the window builds its page (plain imports, so import-linter sees them).
Each tool's engineer adds its page's factory and its row below.
"""
from __future__ import annotations

from attn_explorer.gui.widgets.pages import Page

GROUP = "Interventions"  # one top-level tab, each page a sub-tab in it


def _ablation(state):
    from attn_explorer.gui.interventions.ablation import AblationPage
    from attn_explorer.session.interventions import InterventionSession

    return AblationPage(InterventionSession(state))  # the page gets its own session object, as napari's QtDims(dims)


def _relevance(state):
    from attn_explorer.gui.interventions.relevance import RelevancePage

    return RelevancePage(state)


def _lens(state):
    from attn_explorer.gui.interventions.lens import LensPage

    return LensPage(state)


def _flow(state):
    from attn_explorer.gui.interventions.flow import FlowPage

    return FlowPage(state)


def _why(state):
    from attn_explorer.gui.interventions.why import WhyPage

    return WhyPage(state)


INTERVENTION_PAGES: list[Page] = [
    Page("ablation", "Switch off", _ablation, GROUP),
    Page("relevance", "Relevance", _relevance, GROUP),
    Page("lens", "Logit lens", _lens, GROUP),
    Page("flow", "Contributions", _flow, GROUP),
    Page("why", "Why this head", _why, GROUP),
]
