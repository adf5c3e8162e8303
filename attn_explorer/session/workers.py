"""The one way a long job runs: superqt's workers, started through `launch`, kept in one registry.

- A plain function becomes a `Job` (superqt's public `FunctionWorker`, plus a `progressed(fraction,
  message)` signal for loaders that report through a callback).
- A generator function becomes superqt's `GeneratorWorker`: each `yield` arrives as `yielded`, which
  is how streams (the n sweep, the cost sweep, training, generation) report partial results.

Only superqt's public API is used. Live workers sit in our own registry (`_LIVE`, a set) until their
`finished` signal arrives, so Python never collects one mid-run; they start in Qt's global thread pool.
Cancellation is superqt's `quit()`: a `Job` then emits no result and its progress callback raises
`Cancelled`; a generator stops at its next `yield`.

Errors never escape: `on_error` gets one line, a `UserError`'s own message or "ExceptionName: message"
(which covers `MemoryError` and torch's out-of-memory).
"""
from __future__ import annotations

import functools
import inspect
import time
import traceback
import weakref
from typing import Any, Callable

from PySide6.QtCore import QObject, QThreadPool, Qt, Signal
from superqt.utils import FunctionWorker, GeneratorWorker, WorkerBase

from attn_explorer.core.progress import Stopped, watching  # no torch: the stop check between layers and tiles
from attn_explorer.errors import UserError, error_message

__all__ = ["Cancelled", "Job", "launch", "live_workers", "await_workers", "error_message"]


class Cancelled(Exception):
    """Raised inside a job that noticed its cancel flag; it ends the job quietly."""


def _watched(fn: Callable[..., Any], ref: list) -> Callable[..., Any]:
    """fn run under core.progress.watching(stop=its worker's quit flag) (issue 24): a forward or a lazy tile
    job in it stops between layers or tiles once `quit()` is called, raising Stopped, which ends the job
    quietly. `ref` holds a weak reference to the worker, set once it exists. A generator stays a generator (superqt picks its
    worker by that); the signature stays fn's (Job injects `progress` and `worker` by it)."""

    def stop() -> bool:
        return bool(ref) and _quit_asked(ref[0])

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args: Any, **kwargs: Any):
            with watching(stop=stop):
                return (yield from fn(*args, **kwargs))  # its return value is the job's result
        return gen

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with watching(stop=stop):
            return fn(*args, **kwargs)
    return call


class _Progress(QObject):
    """A Job's own progress signal (created in the launching thread, so its handlers run there)."""

    progressed = Signal(float, str)  # fraction in [0, 1], message


class Job(FunctionWorker):
    """Runs `fn(*args, **kwargs)` in the pool. If `fn` takes `progress`, it gets a callback that emits
    `progressed` (and raises `Cancelled` once `quit()` was called); if it takes `worker`, it gets the job."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        kwargs = dict(kwargs)
        if "progress" in params and "progress" not in kwargs:
            kwargs["progress"] = self.report_progress
        if "worker" in params:
            kwargs["worker"] = self
        super().__init__(fn, *args, **kwargs)
        self._progress = _Progress()
        self.progressed = self._progress.progressed

    def report_progress(self, fraction: float, message: str = "") -> None:
        if self.abort_requested:
            raise Cancelled()
        self.progressed.emit(float(fraction), str(message))

    def work(self) -> Any:
        try:
            return super().work()
        except (Cancelled, Stopped):
            self.quit()
            return None


_LIVE: set[WorkerBase] = set()  # started and not yet finished: held here so Python never collects one mid-run


QUEUED = Qt.ConnectionType.QueuedConnection


def _quit_asked(ref: weakref.ref) -> bool:
    worker = ref()
    return worker is None or worker.abort_requested


def _connect_error(worker: WorkerBase, on_error: Callable[[str], None] | None) -> None:
    ref = weakref.ref(worker)  # handlers hold no strong reference: a finished worker can be collected

    def report(exc: BaseException) -> None:
        if isinstance(exc, (Cancelled, Stopped)) or _quit_asked(ref):
            return
        if not isinstance(exc, UserError):
            traceback.print_exception(type(exc), exc, exc.__traceback__)
        if on_error is not None:
            on_error(error_message(exc))

    worker.errored.connect(report, QUEUED)


def _unless_quit(worker: WorkerBase, handler: Callable[[Any], None]) -> Callable[[Any], None]:
    ref = weakref.ref(worker)

    def deliver(value: Any) -> None:
        if not _quit_asked(ref):
            handler(value)

    return deliver


def launch(
    fn: Callable[..., Any],
    *args: Any,
    on_result: Callable[[Any], None] | None = None,
    on_yield: Callable[[Any], None] | None = None,
    on_error: Callable[[str], None] | None = None,
    on_progress: Callable[[float, str], None] | None = None,
    on_finished: Callable[[], None] | None = None,
    on_started: Callable[[], None] | None = None,
    **kwargs: Any,
) -> WorkerBase:
    """Start `fn` in the pool with its handlers wired in one call; returns the worker (for `quit()`).

    Handlers are connected before the start, so no early signal is missed. `on_result` gets the return
    value (never delivered after `quit()`), `on_yield` each yielded value of a generator function. `on_started`
    runs in the worker's own thread as the job begins (a time stamp: nothing that touches a widget); a job waits
    in the pool while its threads are taken."""
    holder: list = []
    fn = _watched(fn, holder)
    worker: WorkerBase = GeneratorWorker(fn, *args, **kwargs) if inspect.isgeneratorfunction(fn) \
        else Job(fn, *args, **kwargs)
    holder.append(weakref.ref(worker))  # weak: the job's own function does not keep its worker alive
    # Every handler runs in the thread that launched the job (the GUI thread): queued, in emit order.
    # A value already on its way when quit() was called is dropped on arrival: no result after quit.
    if on_result is not None:
        worker.returned.connect(_unless_quit(worker, on_result), QUEUED)
    if on_yield is not None and isinstance(worker, GeneratorWorker):
        worker.yielded.connect(_unless_quit(worker, on_yield), QUEUED)
    if on_progress is not None and isinstance(worker, Job):
        worker.progressed.connect(on_progress, QUEUED)
    _connect_error(worker, on_error)
    if on_finished is not None:
        worker.finished.connect(on_finished, QUEUED)
    if on_started is not None:
        worker.started.connect(on_started, Qt.ConnectionType.DirectConnection)
    # Our registry, and Qt's pool: superqt's start() would defer the start by a 1 ms timer and keep the
    # worker in superqt's private registry; the handlers are already connected, so start at once.
    _LIVE.add(worker)
    ref = weakref.ref(worker)  # no closure over the worker itself: that would keep it alive for ever
    worker.finished.connect(lambda: _LIVE.discard(ref()), QUEUED)
    QThreadPool.globalInstance().start(worker)
    return worker


def live_workers() -> int:
    """Workers started and not yet finished."""
    return len(_LIVE)


def await_stopped(limit_s: float = 1.0) -> None:
    """From a worker: wait, up to limit_s, until every worker asked to stop has ended. A load's full collection
    holds the GIL for most of a second in a big process; made at once, it kept the old model's stopped side jobs
    from reaching their next check, past the second a switch allows them (issue 24 D)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            if not any(w.abort_requested for w in list(_LIVE)):
                return
        except RuntimeError:  # the GUI thread changed the set meanwhile
            pass
        time.sleep(0.01)


def await_workers(msecs: int = 10000) -> None:
    """Ask every live worker to stop, and wait up to `msecs` for them (shutdown, tests)."""
    for w in list(_LIVE):
        w.quit()
    QThreadPool.globalInstance().waitForDone(msecs)
