"""The Interventions tab's pages, in tab order: (name for --view, tab title, factory(state)).

Each page's module is imported when the window builds its page (plain imports, so import-linter sees them).
Each tool's engineer adds its page's factory and its row below.
"""
from __future__ import annotations



def _ablation(state):
    from attn_explorer.gui.interventions.ablation import AblationPage

    return AblationPage(state)


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


INTERVENTION_PAGES: list = [
    ("ablation", "Switch off", _ablation),
    ("relevance", "Relevance", _relevance),
    ("lens", "Logit lens", _lens),
    ("flow", "Contributions", _flow),
    ("why", "Why this head", _why),
]
