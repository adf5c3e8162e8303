"""The Interventions tab's pages, in tab order: (name for --view, tab title, factory(state)).

Each page's module is imported when the window builds its page (plain imports, so import-linter sees them).
Each tool's engineer adds its page's factory and its row below.
"""
from __future__ import annotations

INTERVENTION_PAGES: list = []
