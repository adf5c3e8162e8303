"""The one worker pattern for long jobs: a QRunnable that carries a QObject of signals.

Follows superqt's design. A `Worker` runs `fn(*args, **kwargs)` on a QThreadPool and reports through
`worker.signals`: `started`, `progress(fraction, message)`, `result(object)`, `error(str)`, `finished`.
Live workers are kept in a module-level set so Python does not collect them mid-run. Cancellation is
a flag: `fn` may accept a `worker` keyword and poll `worker.is_cancelled`.

Errors never escape: a `UserError` becomes its own one-line message; anything else (including
`MemoryError` and torch's out-of-memory) becomes "ExceptionName: message" on one line.
"""
from __future__ import annotations

import inspect
import traceback
from typing import Any, Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot

from attn_explorer.errors import UserError

# Workers alive right now; removed when they finish.
_LIVE: set["Worker"] = set()


class WorkerSignals(QObject):
    started = Signal()
    progress = Signal(float, str)  # fraction in [0, 1], message
    result = Signal(object)
    error = Signal(str)  # one line, ready to show the user
    finished = Signal()


class _Reaper(QObject):
    """Drops finished workers from _LIVE in the GUI thread, so they are freed where they were made."""

    @Slot()
    def reap(self) -> None:
        sig = self.sender()
        for w in [w for w in _LIVE if w.signals is sig]:
            _LIVE.discard(w)


_REAPER: _Reaper | None = None


def _reaper() -> _Reaper:
    global _REAPER
    if _REAPER is None:
        _REAPER = _Reaper()
    return _REAPER


class Cancelled(Exception):
    """Raised inside a job that noticed its cancel flag; it ends the job quietly."""


def error_message(exc: BaseException) -> str:
    """One line for the user: a UserError's own message, else 'ExceptionName: message'."""
    if isinstance(exc, UserError):
        text = str(exc)
    else:
        detail = str(exc).strip()
        text = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return " ".join(text.split()) or type(exc).__name__


class Worker(QRunnable):
    """Run `fn(*args, **kwargs)` in a pool thread. Connect to `signals` before calling `start()`."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.setAutoDelete(False)  # Python owns it; _LIVE keeps it alive until finished
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.signals = WorkerSignals()
        self._cancelled = False
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        if "worker" in params:
            self.kwargs["worker"] = self
        if "progress" in params and "progress" not in self.kwargs:
            self.kwargs["progress"] = self.report_progress

    # cancellation ------------------------------------------------------------------------------
    @property
    def is_cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Ask the job to stop; it stops at its next check, and no result is emitted."""
        self._cancelled = True

    def report_progress(self, fraction: float, message: str = "") -> None:
        if self._cancelled:
            raise Cancelled()
        self.signals.progress.emit(float(fraction), str(message))

    # running -----------------------------------------------------------------------------------
    def start(self, pool: QThreadPool | None = None) -> "Worker":
        """Queue the job. Connect to `signals` before this call, so no early signal is missed."""
        _LIVE.add(self)
        self.signals.finished.connect(_reaper().reap)
        (pool or QThreadPool.globalInstance()).start(self)
        return self

    def run(self) -> None:  # called in the pool thread
        sig = self.signals
        try:
            sig.started.emit()
            if self._cancelled:
                return
            out = self.fn(*self.args, **self.kwargs)
            if not self._cancelled:
                sig.result.emit(out)
        except Cancelled:
            pass
        except BaseException as exc:  # noqa: BLE001 - a worker must never take the app down
            if not isinstance(exc, UserError):
                traceback.print_exc()
            try:
                sig.error.emit(error_message(exc))
            except RuntimeError:  # signals object already gone (app closing)
                pass
        finally:
            try:
                sig.finished.emit()
            except RuntimeError:
                pass


def live_workers() -> int:
    return len(_LIVE)
