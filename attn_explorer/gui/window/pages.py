"""The window's pages: `PAGES`, one table of `Page(name, title, factory, group)` rows, in tab order.

Every page is a row here: the explorer's four views, the cost lab, Generate, the Lessons tab and each
lesson, the analyses and the interventions. The feature folders write their own rows (`ANALYSIS_PAGES`,
`INTERVENTION_PAGES`, `LESSON_PAGES`); this module only puts them in order. The window builds its tabs
from the table (rows with a group share one tab of sub-tabs; the lessons' rows are listed in the Lessons
tab and built when shown), `show_page`, `--view` and `--lesson` find a page by name in it, and `actions`
reads the View menu's titles from it without importing the window. A page's module is imported when
its factory runs, so the cost, generate and lessons modules load with the window, not with `gui`.
"""
from __future__ import annotations

from attn_explorer.gui.analysis.pages import ANALYSIS_PAGES
from attn_explorer.gui.explorer.grid_view import HeadGridView
from attn_explorer.gui.explorer.head_view import HeadView
from attn_explorer.gui.explorer.overlay_view import PatchOverlayView
from attn_explorer.gui.explorer.token_view import TokenFocusView
from attn_explorer.gui.interventions.pages import INTERVENTION_PAGES
from attn_explorer.gui.lessons import LESSON_PAGES, LESSONS_GROUP
from attn_explorer.gui.widgets.pages import Page

FITTED_PAGES = ("grid", "head", "tokens", "overlay")  # laid out to fit 1024×700 as they are; others scroll


def _cost(state):
    from attn_explorer.gui.cost.page import CostPage

    return CostPage(state)


def _generate(state):
    from attn_explorer.gui.generate.page import GeneratePage

    return GeneratePage(state)


def _lessons(state):
    from attn_explorer.gui.lessons import LessonsPage

    return LessonsPage(state)


PAGES: tuple[Page, ...] = (
    Page("grid", "All heads", HeadGridView),
    Page("head", "One head", HeadView),
    Page("tokens", "Tokens", TokenFocusView),  # "Token focus": the page's own title says so
    Page("overlay", "Overlay", PatchOverlayView),  # short titles: every tab shows at 1024 px
    Page("cost", "Cost", _cost),  # the cost lab
    Page("generate", "Generate", _generate),  # generation with each new token's attention, for decoders
    Page("lessons", "Lessons", _lessons),  # the primer's lessons: the list and the lesson shown
    *LESSON_PAGES,  # each lesson, in the Lessons tab (group LESSONS_GROUP), built when first shown
    *ANALYSIS_PAGES,  # sub-tabs of one "Analyses" tab, so the tab bar stays readable at 1024 px
    *INTERVENTION_PAGES,  # switch off, patching, logit lens, contributions, relevance, why: one "Interventions" tab
)
BY_NAME: dict[str, Page] = {p.name: p for p in PAGES}
LESSON_NAMES: tuple[str, ...] = tuple(p.name for p in PAGES if p.group == LESSONS_GROUP)


def page_named(name: str) -> Page:
    """The row of page `name` (KeyError for an unknown name)."""
    return BY_NAME[name]
