"""The model host: what loads the session's model, runs it, and says whether it loaded.

`ModelHost` owns the `Runner` (one model job at a time, newest request first, stale results dropped)
and the model handle that only worker threads use. `load` reads a model in the background and reports
`loaded(Loaded)` or `load_failed(message)`; `run_task` and `pool_task` are the jobs of a run and of a
re-pooling, as the runner starts them; `submit` runs side jobs in the runner's named lanes. It knows
nothing of the input or of what is on screen: the session (`state.SessionState`) decides what to run.
The model package itself (and with it torch) is imported inside the jobs.
"""
from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

from attn_explorer.api.result import RunResult
from attn_explorer.session.jobs import Loaded, Loader, default_loader, load_job, pinned_job, pool_job, run_job
from attn_explorer.session.runner import Runner, Task


def _weak(model: Any) -> Callable[[], Any]:
    """A weak reference to model; for an object that takes none, a callable that cannot tell, so says "alive"
    (the load then collects fully) without holding it."""
    try:
        return weakref.ref(model)
    except TypeError:
        return lambda: True


class ModelHost(QObject):
    """Loads the model and runs it. `device` and `dtype` are what the next load reads it with."""

    loading = Signal(str)  # what is being loaded ("" = the default)
    load_progressed = Signal(float, str)  # fraction, message
    loaded = Signal(object)  # Loaded: the model, its ModelInfo, the built-in models
    load_failed = Signal(str)  # one line for the user; the old model (if any) stays

    def __init__(self, loader: Loader | None = None, device: str = "auto", dtype: str = "float32",
                 parent: QObject | None = None):
        super().__init__(parent)
        self.loader = loader or default_loader
        self.device = device
        self.dtype = dtype  # float32, bfloat16 or float16
        self.runner = Runner(self)
        self.model: Any = None  # the handle for the next job; only worker threads use it
        self.builtins: list[tuple[str, str]] = []  # (name, description) of the built-in models
        self.shut_down = False
        # issue 24 D, memory: the source the model was loaded from; the models the user pinned, {(source, dtype,
        # device): Loaded}, kept in memory across switches (a switch back reads nothing); a model not pinned is let
        # go when the next load begins, before its weights are read. `let_go` is (source, want_image) of the model
        # let go by the load in flight: read again if that load fails.
        self.source: str | None = None
        self._want_image = False
        self.pinned: dict[tuple, Loaded] = {}
        self._coming: tuple | None = None  # (source, want_image) of the load in flight
        self.let_go: tuple | None = None
        self.came_back = False  # the model loaded last is the one a failed load had let go, read again

    # ----------------------------------------------------------------------------- loading
    def key(self, src: str | None) -> tuple:
        """What a pinned model is found by: its source, dtype and device."""
        return (src, self.dtype, self.device)

    def load(self, src: str | None, want_image: bool) -> None:
        """Load `src` (None: the default text or image model) in the background; whatever is in flight stops.
        The model loaded now is let go first, unless it is pinned (then it stays, and is not read again)."""
        kept, old = self.pinned.get(self.key(src)), None
        if self.model is not None and not self.is_pinned():
            self.let_go = (self.source, self._want_image)
            old = _weak(self.model)  # the load job sees whether it is gone (jobs.drop_kept_prefix)
            self.model = None  # the Model's last reference here: its weights go before the new ones are read
        self._coming = (src, want_image, False)
        if kept is not None:
            task = Task(partial(pinned_job, old=old), (kept,), on_result=self._on_loaded, on_error=self._load_failed)
        else:
            task = Task(partial(load_job, dtype=self.dtype, old=old), (self.loader, src, self.device, want_image),
                        on_result=self._on_loaded, on_error=self._load_failed, on_progress=self.load_progressed.emit)
        self.runner.load(task)
        self.loading.emit(src or "")

    def _on_loaded(self, loaded: Loaded) -> None:
        self.model = loaded.model
        self.source, self._want_image, self.came_back = self._coming if self._coming is not None else (None, False, False)
        self._coming = self.let_go = None
        if loaded.builtins:
            self.builtins = loaded.builtins
        if self.is_pinned():
            self.pinned[self.key(self.source)] = loaded
        self.loaded.emit(loaded)

    def _load_failed(self, message: str) -> None:
        """A load failed: the old model stays, or, when it was let go for this load, it is read again."""
        back, self.let_go, self._coming = self.let_go, None, None
        self.load_failed.emit(message)
        if back is not None and self.model is None and not self.shut_down:
            self.load(*back)  # "loading …" says so; the session keeps its view (state: came_back)
            self._coming = (*back, True)

    def is_pinned(self) -> bool:
        """The model loaded now is pinned: it stays in memory when another is loaded."""
        return self.model is not None and self.key(self.source) in self.pinned

    def pin(self, on: bool, info: Any = None) -> None:
        """Pin the model loaded now (keep it in memory across switches), or let it be freed at the next switch."""
        if self.model is None:
            return
        if on:
            self.pinned[self.key(self.source)] = Loaded(model=self.model, info=info if info is not None
                                                        else self.model.info, builtins=list(self.builtins))
        else:
            self.pinned.pop(self.key(self.source), None)

    def release(self) -> None:
        """Let the model go (a saved run is shown without it): no answer of a job started on it arrives."""
        self.runner.release_model()
        self.model = None
        self.source = None

    # ----------------------------------------------------------------------------- running
    @staticmethod
    def stack_args(stack: str) -> tuple:
        """The extra argument of run_job and pool_job for an encoder-decoder's other maps."""
        return () if stack == "encoder" else (stack,)

    def run_task(self, x: Any, kw: dict, hide_special: bool, stack: str, on_result: Callable[[Any], None],
                 on_error: Callable[[str], None], on_progress: Callable[[float, str], None] | None = None,
                 on_partial: Callable[[Any], None] | None = None) -> Task:
        """The job that runs the model on x (Model.run keyword arguments kw) and pools its grid mosaic;
        on_progress(fraction, jobs.layer_message) after each layer of its forward; on_partial(LivePart) after
        each layer of a long (lazy) run, its heads' cells filled in (session.live_run)."""
        return Task(run_job, (self.model, x, kw, hide_special, *self.stack_args(stack)), on_result=on_result,
                    on_error=on_error, on_progress=on_progress, on_partial=on_partial)

    @classmethod
    def pool_task(cls, r: RunResult, hide_special: bool, stack: str, on_result: Callable[[RunResult], None],
                  on_error: Callable[[str], None]) -> Task:
        """The job that pools r's grid mosaic again (hide specials, another stack): nothing runs again."""
        return Task(pool_job, (r, hide_special, *cls.stack_args(stack)), on_result=on_result, on_error=on_error)

    @staticmethod
    def same_run(a: tuple, b: tuple) -> bool:
        """(model, input, run kwargs) a and b would give the same maps."""
        (model_a, x_a, kw_a), (model_b, x_b, kw_b) = a, b
        same_x = x_a == x_b if isinstance(x_a, str) and isinstance(x_b, str) else x_a is x_b
        return model_a is model_b and same_x and kw_a == kw_b

    # ----------------------------------------------------------------------------- side jobs
    def submit(self, fn, *args, key: str, on_result=None, on_error=None, on_yield=None, on_progress=None,
               uses_model: bool = True) -> bool:
        """Run a side job in lane `key`, newest wins (see `SessionState.submit`); False when nothing started."""
        if self.shut_down:
            return False
        if uses_model:
            if self.model is None:
                return False
            args = (self.model, *args)
        self.runner.submit(key, Task(fn, args, on_result=on_result, on_error=on_error, on_progress=on_progress,
                                     on_yield=on_yield), uses_model=uses_model)
        return True

    def shutdown(self, wait: bool = True) -> None:
        """Stop every job; wait for the pool (10 s at most) or not. No side job starts any more."""
        self.shut_down = True
        self.runner.shutdown(10000 if wait else 0)
        self.blockSignals(True)
        self.runner.blockSignals(True)
