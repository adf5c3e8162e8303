"""Your own analyses (`ax.register_analysis`) for the window: what the *Yours* page runs in a worker.

Both reading the registry and running an analysis happen in a job, never in the GUI thread: the first read
loads installed packages' entry points, whose imports may pull in torch, and a user's function may run
anything. Only plain data comes back: the names, one-line problems, and the checked NumPy answer.
"""
from __future__ import annotations

from dataclasses import dataclass

from attn_explorer.api.analyses import AnalysisAnswer, catalogue, problems, run_analysis
from attn_explorer.errors import UserError

__all__ = ["AnalysisAnswer", "CustomReport", "HOW_TO_REGISTER", "custom_analysis_job"]

HOW_TO_REGISTER = ("No analyses registered yet: in Python, call ax.register_analysis(\"name\", fn) with "
                   "fn(result) -> an (L, H), (N,) or (N, N) NumPy array, then press Run again.")


@dataclass(frozen=True)
class CustomReport:
    """One visit of the registry: what is registered, what could not be loaded, and the chosen one's answer."""

    names: list[tuple[str, str | None]]  # (name, view or None) of every registered analysis
    problems: list[str]  # one line per installed entry point that could not be loaded
    answer: AnalysisAnswer | None  # the chosen analysis's checked answer (None: nothing registered)
    error: str = ""  # one line when the chosen analysis failed or answered badly (answer is then None)


def custom_analysis_job(name: str | None, result) -> CustomReport:
    """List the analyses and run `name` (the first one when None or gone) on `result`. A failing or badly
    answering analysis comes back as `error`, with the list, so the page keeps its chooser and last view."""
    names, broken = catalogue(), problems()
    known = [n for n, _ in names]
    if not known:
        return CustomReport(names, broken, None)
    chosen = name if name in known else known[0]
    try:
        return CustomReport(names, broken, run_analysis(chosen, result))
    except UserError as e:
        return CustomReport(names, broken, None, str(e))
