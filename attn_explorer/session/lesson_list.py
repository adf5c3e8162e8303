"""The lessons' names and titles, torch-free: the window lists them before any lesson (or torch) loads.

`session.lessons` is the lessons' job functions and imports torch; this module is what the window,
the `--lesson` check and the Lessons tab's list read at start-up.
"""
from __future__ import annotations

from attn_explorer.lessons import LESSONS, lesson_names

__all__ = ["LESSONS", "lesson_names"]
