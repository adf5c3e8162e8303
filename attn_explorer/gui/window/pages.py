"""The window's pages, by name: `PAGES` (name -> tab title and factory), in tab order.

The explorer's four pages are registered here at import; the others (cost, generate, lessons,
analyses) by `register_all`, which the window calls, so their modules load with the window, not with
`gui`. `actions` reads the titles for the View menu from here, and so does not import the window.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtWidgets import QWidget

from attn_explorer.gui.explorer.grid_view import HeadGridView
from attn_explorer.gui.explorer.head_view import HeadView
from attn_explorer.gui.explorer.overlay_view import PatchOverlayView
from attn_explorer.gui.explorer.token_view import TokenFocusView
from attn_explorer.session.state import SessionState

FITTED_PAGES = ("grid", "head", "tokens", "overlay")  # laid out to fit 1024×700 as they are; others scroll

# name -> (tab title, factory(state) -> QWidget). Insertion order is tab order.
PAGES: dict[str, tuple[str, Callable[[SessionState], QWidget]]] = {}
# name -> the title of the tab that groups it with others (a tab of sub-tabs), for pages that share one
GROUP_OF: dict[str, str] = {}


def register_page(name: str, title: str, factory: Callable[[SessionState], QWidget], group: str | None = None) -> None:
    """Add a page; pages with the same `group` share one top-level tab, each a sub-tab in it."""
    PAGES[name] = (title, factory)
    if group:
        GROUP_OF[name] = group


register_page("grid", "All heads", HeadGridView)
register_page("head", "One head", HeadView)
register_page("tokens", "Tokens", TokenFocusView)  # "Token focus": the page's own title says so
register_page("overlay", "Overlay", PatchOverlayView)  # short titles: every tab shows at 1024 px


def _register_cost_page() -> None:
    """The cost lab: one tab."""
    if "cost" not in PAGES:
        from attn_explorer.gui.cost.page import CostPage

        register_page("cost", "Cost", CostPage)


def _register_generate_page() -> None:
    """Generation with each new token's attention, for decoders: one tab."""
    if "generate" not in PAGES:
        from attn_explorer.gui.generate.page import GeneratePage

        register_page("generate", "Generate", GeneratePage)


def _register_lessons_page() -> None:
    """The primer's lessons, one tab; each lesson's module loads when it is first shown."""
    if "lessons" not in PAGES:
        from attn_explorer.gui.lessons import LessonsPage

        register_page("lessons", "Lessons", LessonsPage)


def _register_analysis_pages() -> None:
    """The analyses (overview, rollout, norms, search, compare, lines): sub-tabs of one "Analyses" tab,
    so the tab bar stays readable at 1024 px."""
    from attn_explorer.gui.analysis.pages import ANALYSIS_PAGES

    for name, title, factory in ANALYSIS_PAGES:
        if name not in PAGES:
            register_page(name, title, factory, group="Analyses")


def _register_intervention_pages() -> None:
    """Interventions (switch heads off, patching, logit lens, contributions, relevance, why a head looks
    there): sub-tabs of one "Interventions" tab."""
    from attn_explorer.gui.interventions.pages import INTERVENTION_PAGES

    for name, title, factory in INTERVENTION_PAGES:
        if name not in PAGES:
            register_page(name, title, factory, group="Interventions")


def register_all() -> None:
    """Every page, in tab order (idempotent: the window calls it each time it is built)."""
    _register_cost_page()
    _register_generate_page()
    _register_lessons_page()
    _register_analysis_pages()
    _register_intervention_pages()
