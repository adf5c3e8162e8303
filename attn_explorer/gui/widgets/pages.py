"""`Page`: one row of the window's page table (gui/window/pages.py), by which every page is registered.

It sits with the shared widgets so that each feature folder can write its own rows (the analyses,
the interventions, the lessons) without importing the window or another feature.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from PySide6.QtWidgets import QWidget


@dataclass(frozen=True)
class Page:
    """A page of the window, built by `factory(state)` when the window (or, for a lesson, the Lessons tab)
    first needs it."""

    name: str  # what --view, --lesson, show_page and a saved session call it: "grid", "rollout", "by-hand"
    title: str  # its tab's title (a lesson's: its line in the Lessons list)
    factory: Callable[..., QWidget]  # factory(state: SessionState) -> the page; imports its module when called
    group: str | None = None  # the title of the tab it shares with others ("Analyses", "Lessons"); None: its own tab
