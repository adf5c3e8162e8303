"""The doorway from the GUI's analysis pages to the analysis floor, so `gui/` never imports below `session/`.

`session.analysis.rollout` is `attn_explorer.analysis.rollout`, imported on first use. The pure
functions take NumPy and give NumPy. What needs the model (value norms, a second run to compare)
is a job function here, run in a worker: `SessionState.submit(norms_job, ...)`, or `launch(...)`.

`AnalysisSlot` runs one page's newest job and drops the answers of older ones, so a page never draws
a result computed for an input that is no longer on screen.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Callable

from attn_explorer.analysis import ANALYSES

__all__ = ["ANALYSES", "calc", "norms_job", "run_job", "load_job", "AnalysisSlot"]


def calc(name: str) -> ModuleType:
    """The pure module of one analysis ("rollout" -> attn_explorer.analysis.rollout)."""
    if name not in ANALYSES:
        raise AttributeError(f"no analysis {name!r}")
    return importlib.import_module(f"attn_explorer.analysis.{name}")


def __getattr__(name: str) -> ModuleType:
    if name in ANALYSES:
        return calc(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- jobs that need a model (they run in a worker; the first argument is the model) ---------------

def norms_job(model, x, run_kw: dict, layers=None):
    """Raw attention and value-weighted norms of `layers` (all when None) for input x (a LayerNorms)."""
    return calc("norms").model_norms(model, x, layers, **run_kw)


def run_job(model, x, run_kw: dict):
    """model.run(x, **run_kw): the second input of a comparison (a RunResult)."""
    return model.run(x, **run_kw)


def load_job(src: str, device: str = "cpu", progress=None):
    """Load a second model for a comparison (an api Model, kept by the page as an opaque handle)."""
    from attn_explorer.api.load import load_model

    return load_model(src, device=device, progress=progress)


def load_and_run_job(src: str, device: str, x, run_kw: dict, progress=None):
    """(model, its RunResult for x): the second model of a comparison, loaded and run in one job."""
    model = load_job(src, device, progress)
    return model, model.run(x, **run_kw)


class AnalysisSlot:
    """One page's analysis jobs: at most one in flight and one waiting. `start` while a job runs makes
    the new one wait (replacing any other waiting one) and drops the running one's answer, so typing
    fast never piles jobs up in the pool, and a page never draws an answer for an input it no longer shows."""

    def __init__(self, on_error: Callable[[str], None]):
        self._on_error = on_error
        self._gen = 0
        self._worker: Any = None
        self._pending: tuple | None = None
        self.launched = 0  # jobs started, in all (tests)

    @property
    def busy(self) -> bool:
        return self._worker is not None or self._pending is not None

    def cancel(self) -> None:
        """Drop the waiting job and the running one's answer."""
        self._gen += 1
        self._pending = None

    def start(self, fn, *args, on_result: Callable[[Any], None], state=None) -> bool:
        """fn(*args) in a worker, or fn(model, *args) on `state`'s model when state is given (False: no model)."""
        if state is not None and not state.has_model:
            return False
        self._gen += 1
        job = (self._gen, fn, args, on_result, state)
        if self._worker is not None:
            self._pending = job
            return True
        return self._launch(job)

    def _launch(self, job: tuple) -> bool:
        from attn_explorer.session.workers import launch

        gen, fn, args, on_result, state = job

        def done(value):
            self._worker = None
            if gen == self._gen:
                on_result(value)
            self._next()

        def failed(message: str):
            self._worker = None
            if gen == self._gen:
                self._on_error(message)
            self._next()

        self.launched += 1
        if state is not None:
            self._worker = state.submit(fn, *args, on_result=done, on_error=failed)
            return self._worker is not None
        self._worker = launch(fn, *args, on_result=done, on_error=failed)
        return True

    def _next(self) -> None:
        job, self._pending = self._pending, None
        if job is not None:
            self._launch(job)
