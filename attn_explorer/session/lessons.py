"""What the GUI's Lessons page needs from the lessons floor, so `gui/` never imports below `session/`.

The lesson pages compute through the functions re-exported here; heavy work (training, real-model
forward passes) runs through `session.workers.launch`.
"""
from __future__ import annotations

from attn_explorer.lessons import LESSONS, lesson_names

__all__ = ["LESSONS", "lesson_names"]
