"""The doorway from the GUI's lesson pages to the lessons floor, so `gui/` never imports below `session/`.

`session.lessons.by_hand` is `attn_explorer.lessons.by_hand`, imported on first use (with torch, so
never at start-up). Lesson functions return NumPy arrays and plain data; anything slow (a real
model's forward pass, training) runs in a worker: `SessionState.submit` or `workers.launch`.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from attn_explorer.lessons import LESSONS, lesson_names

__all__ = ["LESSONS", "lesson_names", "calc", "head_trace"]


def calc(name: str) -> ModuleType:
    """The pure module of one lesson ("by-hand" or "by_hand" -> attn_explorer.lessons.by_hand)."""
    return importlib.import_module(f"attn_explorer.lessons.{name.replace('-', '_')}")


def head_trace(model, x, layer: int, head: int, query: int, run_kw: dict):
    """`api.probe.head_trace` for a worker (`state.submit`): the lessons floor may not import api/, nor may gui/."""
    from attn_explorer.api.probe import head_trace as trace

    return trace(model, x, layer, head, query, **run_kw)


def __getattr__(name: str) -> ModuleType:
    if name.replace("_", "-") in LESSONS or name in ("common",):
        return calc(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
