"""The n sweep: the current model timed at log-spaced sequence lengths, one forward pass per runner job.

Its steps are the runner's background work: the runner asks for the next one only when no load or run
waits, so typing during a sweep is served after at most one sweep forward pass. The sweep only reports
(n, median forward ms): it never changes the attention on screen.

`time_fit` is the fit the panel draws through those points (or through the user's own runs): the cost
floor's `cost.fit.quadratic_fit`, handed over as plain data (coefficients, or why there are none, the
doubling factor and the n² term's share).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Signal

from attn_explorer.api.result import ModelInfo, RunResult
from attn_explorer.cost.fit import FIT_MIN_LENGTHS, FIT_MIN_SPAN, QuadraticFit, quadratic_fit
from attn_explorer.session.jobs import sweep_job
from attn_explorer.session.runner import MAIN_NAMES, SHARED_SHARE, Runner, Task

# a step timed beside other work (Runner.work) is measured again this many times at most, then kept and marked
RETRIES = 2


__all__ = ["NSweep", "sweep_lengths", "time_fit", "QuadraticFit", "FIT_MIN_LENGTHS", "FIT_MIN_SPAN"]


def time_fit(points) -> QuadraticFit:
    """forward ms ≈ a·n² + b·n + c through (n, ms) points, or why the points cannot carry it."""
    pts = np.asarray(list(points), dtype=np.float64).reshape(-1, 2)
    return quadratic_fit(pts[:, 0], pts[:, 1])


def sweep_lengths(info: ModelInfo, points: int = 9) -> list[int]:
    """Text: log-spaced token counts from 8 to the model's max positions.
    Image: log-spaced patch-grid sides from 4 to twice the default grid (square images)."""
    if info.modality == "image" and info.patch_size:
        default = max(4, (info.image_size or 224) // info.patch_size)
        return sorted({int(round(g)) for g in np.geomspace(4, 2 * default, points - 1)})
    top = max(9, int(info.max_positions))
    return sorted({int(round(n)) for n in np.geomspace(8, top, points)})


@dataclass(frozen=True)
class _Step:
    x: Any  # the input: text, or an image
    kw: dict  # Model.run keyword arguments, with the length (max_tokens or image_size)
    want: int  # the length this step measures (tokens, or patch-grid side for images)
    reps: int  # text: copies of the input to join so that it reaches `want` tokens
    warm_up: bool = False  # the first pass only warms caches up; it is not reported
    retries: int = 0  # times this step was measured again because other work ran beside it


class NSweep(QObject):
    """Times `model` at several n through `runner`. Points stream out as each length is done."""

    started = Signal(int)  # number of sequence lengths to measure
    progressed = Signal(int, int)  # forward passes done, in all
    point_measured = Signal(int, float)  # n, median forward ms at that n
    finished = Signal(bool)  # True: every length measured; False: cancelled or failed
    failed = Signal(str)  # one line: why the sweep stopped

    def __init__(self, runner: Runner, parent: QObject | None = None):
        super().__init__(parent)
        self._runner = runner
        runner.background = self._next_task
        self.points: list[tuple[int, float]] = []  # (n, median forward ms) per measured length
        self.repeats = 3
        self.repeated_input = False  # the text was repeated to reach the longer lengths
        self._model: Any = None
        self._id = 0  # bumps on every start and cancel: a step of an older sweep reports nothing
        self._queue: list[_Step] = []
        self._in_flight = False  # a step of the current sweep is running
        self._samples: dict[int, list[float]] = {}
        self._done = 0
        self._total = 0
        # the lengths whose times still had other work beside them after RETRIES, and what that work was
        self.beside: set[int] = set()
        self.beside_jobs: set[str] = set()

    @property
    def running(self) -> bool:
        return bool(self._queue) or self._in_flight

    def clear(self) -> None:
        """Forget the points (a new model)."""
        self.points = []

    def fit(self) -> QuadraticFit:
        """The quadratic fit through the measured points (see `time_fit`)."""
        return time_fit(sorted(self.points))

    def start(self, model: Any, info: ModelInfo, x: Any, kw: dict, last: RunResult | None,
              repeats: int = 3, lengths: list[int] | None = None) -> bool:
        """Time `model` at each length, `repeats` runs per length; x and kw are what the view runs now,
        `last` the result on screen (its token counts say how often to repeat the text). Returns False
        when there is nothing to measure."""
        self.cancel()
        kw = {k: v for k, v in kw.items() if k not in ("max_tokens", "image_size")}
        lengths = sorted(set(lengths or sweep_lengths(info)))
        steps: list[_Step] = []
        repeated = False
        if info.modality == "image":
            if x is None or not info.patch_size:
                return False
            steps = [_Step(x, {**kw, "image_size": g * info.patch_size}, g, 1) for g in lengths]
        else:
            if not isinstance(x, str) or not x.strip():
                return False
            lengths = [n for n in lengths if 1 <= n <= info.max_positions]
            r = last if last is not None and last.grid is None else None
            total = r.total_tokens if r is not None and r.total_tokens else 0
            extra = int(np.count_nonzero(r.special)) if r is not None else 0
            per_copy = max(1, total - extra)
            for n in lengths:
                reps = max(1, math.ceil((n - extra) / per_copy)) if total else 1
                steps.append(_Step(x, {**kw, "max_tokens": n}, n, reps))
            repeated = bool(total) and max(lengths, default=0) > total
        if not steps:
            return False
        first = steps[0]
        self._queue = [_Step(first.x, first.kw, first.want, first.reps, warm_up=True)]
        self._queue += [s for s in steps for _ in range(max(1, repeats))]
        self._id += 1
        self._model = model
        self.repeats = max(1, repeats)
        self.repeated_input = repeated
        self.points = []
        self._samples = {}
        self.beside, self.beside_jobs = set(), set()
        self._done = 0
        self._total = len(self._queue) - 1
        self.started.emit(len(lengths))
        self._runner.wake()
        return True

    def cancel(self) -> None:
        """Stop: no more steps start, and the one in flight reports nothing."""
        if not self.running:
            return
        self._stop()
        self._runner.cancel_background()
        self.finished.emit(False)

    def _stop(self) -> None:
        self._queue = []
        self._in_flight = False
        self._model = None
        self._id += 1

    # ----------------------------------------------------------------------------- steps
    def _next_task(self) -> Task | None:
        """The runner's background source: the next step, or None."""
        if not self._queue or self._in_flight:
            return None
        step = self._queue.pop(0)
        self._in_flight = True
        sid = self._id
        return Task(sweep_job, (self._model, step.x, step.kw, step.want, step.reps),
                    on_result=lambda out: self._measured(sid, step, out),
                    on_error=lambda message: self._failed(sid, message))

    def _measured(self, sid: int, step: _Step, out: tuple[int, float, bool]) -> None:
        if sid != self._id:
            return
        self._in_flight = False
        if not step.warm_up:
            n, ms, repeated = out
            now = time.perf_counter()  # the pass ended just before its answer arrived here
            other = self._runner.work(now - ms / 1000.0, now, SHARED_SHARE, exclude=(MAIN_NAMES["background"],))
            if other and step.retries < RETRIES:  # not the model's time alone: measure it again
                self._queue.insert(0, replace(step, retries=step.retries + 1))
                return
            if other:
                self.beside.add(n)
                self.beside_jobs.update(other)
            self.repeated_input = self.repeated_input or repeated
            samples = self._samples.setdefault(n, [])
            samples.append(ms)
            self._done += 1
            self.progressed.emit(self._done, self._total)
            nxt = self._queue[0] if self._queue else None
            if len(samples) >= self.repeats or nxt is None or nxt.want != step.want:
                point = (n, float(np.median(samples)))
                self.points = [p for p in self.points if p[0] != n] + [point]
                self.point_measured.emit(*point)
        if not self._queue:
            self._model = None
            self.finished.emit(True)

    def _failed(self, sid: int, message: str) -> None:
        if sid != self._id:
            return
        self._stop()
        self.failed.emit(f"n sweep stopped: {message}")
        self.finished.emit(False)
