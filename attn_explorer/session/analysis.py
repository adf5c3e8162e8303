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
    """One page's job in flight: `start` launches fn in a worker and quits the one before it; an
    answer that arrives for an older start is dropped."""

    def __init__(self, on_error: Callable[[str], None]):
        self._on_error = on_error
        self._gen = 0
        self._worker: Any = None

    @property
    def busy(self) -> bool:
        return self._worker is not None

    def cancel(self) -> None:
        self._gen += 1
        if self._worker is not None:
            self._worker.quit()
            self._worker = None

    def start(self, fn, *args, on_result: Callable[[Any], None], state=None) -> bool:
        """fn(*args) in a worker, or fn(model, *args) on `state`'s model when state is given (False: no model)."""
        from attn_explorer.session.workers import launch

        self.cancel()
        gen = self._gen

        def done(value):
            if gen == self._gen:
                self._worker = None
                on_result(value)

        def failed(message: str):
            if gen == self._gen:
                self._worker = None
                self._on_error(message)

        if state is not None:
            self._worker = state.submit(fn, *args, on_result=done, on_error=failed)
            return self._worker is not None
        self._worker = launch(fn, *args, on_result=done, on_error=failed)
        return True
