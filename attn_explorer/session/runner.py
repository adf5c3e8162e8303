"""The runner: the session's model jobs (load, run, sweep step), one at a time, newest request first.

Jobs start through `workers.launch` in the shared pool; the runner itself keeps them one at a time,
because two forward passes at once would only fight over the same cores and the same model. The next
job starts when the previous one has finished (its `finished` handler, in the GUI thread):

1. a waiting load (a newer load replaces a waiting one and stops the one in flight);
2. the newest run request: requests made while a job is in flight collapse into one, and a request is
   made into a job only when it starts (`prepare()`), so it sees the input and model of that moment;
3. a background step (the n sweep), asked of `background()` only when nothing else waits.

Side jobs (a lesson's numbers, an analysis, a second model to compare) run beside these in named
lanes (`submit(key, task)`): newest wins in each lane, as for runs. A lane has at most one job in
flight and one waiting; a newer request replaces the waiting one and drops the answer of the one in
flight, so typing fast never piles jobs up and a page never draws an answer for an input it no longer
shows. A lane job that uses the model also loses its answer to any load asked for after it started, and
to the model being let go (`release_model`: a saved run opened without its model).

What comes back is dropped when it is stale: the result of a cancelled job, of any job started before
the newest load request (it belongs to the old model), and of a run older than the one delivered last.
A run that a load stopped is served again (on the old model) if that load fails.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from functools import partial as bind
from typing import Any, Callable

from PySide6.QtCore import QObject, Qt, QTimer, Signal

from attn_explorer.session.workers import await_workers, launch


# lanes whose jobs read the model's tensors without taking the model: the long views' tiles of a run's q and k
# (session.long_view's "long-…" lanes). A model switch ends them with the model's own (Runner.drop_model_jobs).
MODEL_BOUND = ("long-",)


@dataclass
class Task:
    """One job: `fn(*args)` in a worker thread, its handlers called in the GUI thread."""

    fn: Callable[..., Any]
    args: tuple = ()
    on_result: Callable[[Any], None] | None = None
    on_error: Callable[[str], None] | None = None  # one line
    on_progress: Callable[[float, str], None] | None = None  # loads: fraction, message
    on_yield: Callable[[Any], None] | None = None  # side jobs whose fn is a generator: each value
    # runs: a part of the result while it is computed (session.live_run.LivePart, a layer at a time); fn then
    # gets `partial`, a callable to send those with from its worker thread (issue 24 C)
    on_partial: Callable[[Any], None] | None = None


class _Parts(QObject):
    """A run's channel for its parts (created in the GUI thread, so the queued handler runs there)."""

    sent = Signal(object)


@dataclass
class _Lane:
    """One lane of side jobs (see `Runner.submit`)."""

    gen: int = 0  # number of the newest request
    worker: Any = None  # the job in flight
    waiting: tuple | None = None  # (gen, task, uses_model) of the request that waits
    uses_model: bool = False  # the job in flight runs on the model
    began: list | None = None  # [time.perf_counter()] once the job in flight left the pool's queue and began


@dataclass
class _InFlight:
    kind: str  # "load", "run" or "background"
    gen: int  # run: its request number
    epoch: int  # load requests made before it started
    prepare: Callable[[], Task | None] | None = None  # run: what made it (to serve it again after a failed load)
    worker: Any = None
    cancelled: bool = False
    started: float = 0.0  # time.perf_counter() when it started
    parts: Any = None  # its _Parts channel, held while it runs
    began: list | None = None  # [time.perf_counter()] once it left the pool's queue and began


# A run in flight younger than this finishes when a newer request comes (a fast model keeps drawing while the user
# types, each answer on screen as before); one still running at this age is stopped between layers (issue 24)
STOP_AFTER_S = 0.3
# other jobs that ran for at least this share of a timing's span shared its cores: the time is not that job's alone
SHARED_SHARE = 0.05
# the names `work` gives the model's own jobs (a side job goes by its lane's name)
MAIN_NAMES = {"run": "model-run", "load": "model-load", "background": "n-sweep"}


class Runner(QObject):
    """Runs Tasks one at a time. `busy` counts loads and runs, in flight or waiting (not background steps)."""

    busy_changed = Signal(bool)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.background: Callable[[], Task | None] | None = None  # next background step, or None
        self._load: Task | None = None  # the load waiting to start
        self._run: tuple[int, Callable[[], Task | None]] | None = None  # newest waiting run request
        self._gen = 0  # number of the newest run request
        self._delivered_gen = 0  # number of the newest run whose result was delivered
        self._epoch = 0  # bumps on every load request, and when the model is let go (release_model)
        self._current: _InFlight | None = None
        self._stopped_run: tuple[int, Callable[[], Task | None]] | None = None  # a run a load stopped
        self._busy = False
        self._lanes: dict[str, _Lane] = {}
        self._spans: deque[tuple[str, float, float]] = deque(maxlen=256)  # (job's name, began, ended): work

    # --------------------------------------------------------------------------- what is going on
    def _in_flight(self, kind: str) -> bool:
        job = self._current
        return job is not None and job.kind == kind and not job.cancelled  # a stopped job is nobody's wait

    @property
    def loading(self) -> bool:
        return self._load is not None or self._in_flight("load")

    @property
    def running(self) -> bool:
        return self._run is not None or self._in_flight("run")

    @property
    def busy(self) -> bool:
        return self.loading or self.running

    @property
    def idle(self) -> bool:
        """No job in flight and none waiting (a background source may still have steps to give)."""
        return self._current is None and self._load is None and self._run is None

    # --------------------------------------------------------------------------- requests
    def load(self, task: Task) -> None:
        """Load a model next. Whatever is in flight is stopped, and its result dropped; so are the old model's
        side jobs (drop_model_jobs)."""
        self._epoch += 1
        self._load = task
        self.drop_model_jobs()
        job = self._current
        if job is not None:
            if job.kind == "run" and not job.cancelled:
                self._stopped_run = (job.gen, job.prepare)
            self._stop(job)
        self._next()

    def request(self, prepare: Callable[[], Task | None]) -> int:
        """Ask for a run; `prepare()` makes its Task when it starts (None: nothing to run). Returns its number.
        A run in flight is stopped (between layers: core.progress), its answer dropped: a long forward on an
        input the user has already changed is time nobody wants (issue 24). One younger than STOP_AFTER_S is
        given until that age to finish (then its answer is drawn, the newest request running next): typing on a
        fast model keeps its live maps."""
        self._gen += 1
        self._run = (self._gen, prepare)
        job = self._current
        if job is not None and job.kind == "run" and not job.cancelled:
            age = time.perf_counter() - job.started
            if age >= STOP_AFTER_S:
                self._stop(job)
            else:
                # self as the context: the timer goes with the runner (a shut-down runner is never called)
                QTimer.singleShot(int((STOP_AFTER_S - age) * 1000) + 1, self, lambda: self._stop_if_superseded(job))
        self._next()
        return self._gen

    def _stop_if_superseded(self, job: _InFlight) -> None:
        """The young run let go on by `request` is stopped if it still runs and a newer request still waits."""
        if self._current is job and not job.cancelled and self._run is not None:
            self._stop(job)

    def drop_model_jobs(self) -> None:
        """Stop every side job of the model loaded now (a model switch, issue 24): those that run on it, and
        those on its run's q and k (the lanes named MODEL_BOUND), waiting or in flight; none of their answers
        arrives. Their pages ask again when the new model's result comes."""
        for key, lane in self._lanes.items():
            waiting_uses = lane.waiting is not None and lane.waiting[2]
            if lane.uses_model or waiting_uses or key.startswith(MODEL_BOUND):
                self.cancel_lane(key)

    def release_model(self) -> None:
        """The model is let go (a saved run is shown without it): every job started on it so far, a side job
        in a lane included, loses its answer, and a load or run that waits is forgotten."""
        self._epoch += 1
        self._load = self._run = self._stopped_run = None
        if self._current is not None and self._current.kind in ("load", "run"):
            self._stop(self._current)
        self._update_busy()

    def cancel(self) -> None:
        """Forget the waiting run and stop the one in flight: no result of either arrives."""
        self._run = None
        if self._current is not None and self._current.kind == "run":
            self._stop(self._current)
        self._update_busy()

    # --------------------------------------------------------------------------- side jobs, in lanes
    def submit(self, key: str, task: Task, uses_model: bool = True) -> None:
        """Run `task` in lane `key`, newest wins: a job in flight there loses its answer, and this one
        starts when it has finished (replacing any other waiting request)."""
        lane = self._lanes.setdefault(key, _Lane())
        lane.gen += 1
        request = (lane.gen, task, uses_model)
        if lane.worker is not None:
            lane.waiting = request
        else:
            self._start_side(key, lane, request)

    def lane_busy(self, key: str) -> bool:
        """A job of lane `key` is in flight or waiting."""
        lane = self._lanes.get(key)
        return lane is not None and (lane.worker is not None or lane.waiting is not None)

    def busy_lanes(self) -> list[str]:
        """The lanes with a job in flight or waiting."""
        return [k for k in self._lanes if self.lane_busy(k)]

    def work(self, start: float, end: float, share: float = 0.0, exclude: tuple[str, ...] = ()) -> dict[str, float]:
        """Seconds that each job, finished or in flight, ran within [start, end] (time.perf_counter), by name (a
        lane's, or MAIN_NAMES' for the model's own), less those in `exclude`: what shared the cores with a timing
        made then (a forward beside the Cost page's sweep, or the sweep beside a forward). A cancelled job counts
        until it ends: its answer is dropped, not its work. {} unless together they ran for at least `share` of
        [start, end]."""
        now = time.perf_counter()
        spans = list(self._spans) + [(k, lane.began[0], now) for k, lane in self._lanes.items()
                                     if lane.worker is not None and lane.began]
        job = self._current
        if job is not None and job.began:
            spans.append((MAIN_NAMES[job.kind], job.began[0], now))
        out: dict[str, float] = {}
        for key, a, b in spans:
            overlap = min(b, end) - max(a, start)
            if overlap > 0 and key not in exclude:
                out[key] = out.get(key, 0.0) + overlap
        return out if sum(out.values()) >= share * max(end - start, 0.0) else {}

    def cancel_lane(self, key: str) -> None:
        """Forget lane `key`'s waiting job and stop the one in flight: no answer of either arrives."""
        lane = self._lanes.get(key)
        if lane is None:
            return
        lane.gen += 1
        lane.waiting = None
        if lane.worker is not None:
            lane.worker.quit()

    def _start_side(self, key: str, lane: _Lane, request: tuple) -> None:
        gen, task, uses_model = request
        epoch = self._epoch

        def fresh() -> bool:
            return gen == lane.gen and not (uses_model and epoch != self._epoch)

        def result(value: Any) -> None:
            if fresh() and task.on_result is not None:
                task.on_result(value)

        def yielded(value: Any) -> None:
            if fresh() and task.on_yield is not None:
                task.on_yield(value)

        def error(message: str) -> None:
            if fresh() and task.on_error is not None:
                task.on_error(message)

        def progress(fraction: float, message: str) -> None:
            if fresh() and task.on_progress is not None:
                task.on_progress(fraction, message)

        def finished() -> None:
            if began:  # it ran (a job stopped while it waited in the pool never began)
                self._spans.append((key, began[0], time.perf_counter()))
            lane.worker, lane.uses_model, lane.began = None, False, None
            waiting, lane.waiting = lane.waiting, None
            if waiting is not None:
                self._start_side(key, lane, waiting)

        began: list[float] = []
        lane.uses_model, lane.began = uses_model, began
        lane.worker = launch(task.fn, *task.args, on_result=result, on_yield=yielded, on_error=error,
                             on_progress=progress if task.on_progress is not None else None, on_finished=finished,
                             on_started=lambda: began.append(time.perf_counter()))

    def cancel_background(self) -> None:
        """Stop the background step in flight; its result does not arrive."""
        if self._current is not None and self._current.kind == "background":
            self._stop(self._current)

    def wake(self) -> None:
        """Start the next job if none is in flight (after the background source got work)."""
        self._next()

    def shutdown(self, msecs: int = 10000) -> None:
        """Drop every waiting job, stop the one in flight and wait for the pool."""
        self.background = None
        self._load = self._run = self._stopped_run = None
        for key in list(self._lanes):
            self.cancel_lane(key)
        if self._current is not None:
            self._stop(self._current)
        await_workers(msecs)
        self._update_busy()

    # --------------------------------------------------------------------------- scheduling
    def _next(self) -> None:
        while self._current is None:
            if self._load is not None:
                task, self._load = self._load, None
                self._start("load", task, 0)
            elif self._run is not None:
                (gen, prepare), self._run = self._run, None
                task = prepare()
                if task is not None:
                    self._start("run", task, gen, prepare)
            else:
                task = self.background() if self.background is not None else None
                if task is None:
                    break
                self._start("background", task, 0)
        self._update_busy()

    def _start(self, kind: str, task: Task, gen: int, prepare: Callable[[], Task | None] | None = None) -> None:
        job = _InFlight(kind, gen, self._epoch, prepare, started=time.perf_counter(), began=[])
        self._current = job
        began = job.began

        def fresh() -> bool:
            return not job.cancelled and job.epoch == self._epoch

        def result(value: Any) -> None:
            if not fresh() or (kind == "run" and gen <= self._delivered_gen):
                return
            if kind == "run":
                self._delivered_gen = gen
            if kind == "load":
                self._stopped_run = None
            if task.on_result is not None:
                task.on_result(value)

        def error(message: str) -> None:
            if not fresh():
                return
            if kind == "load" and self._stopped_run is not None:
                # the old model stays: serve the run the load stopped, unless a newer one waits
                if self._run is None and self._stopped_run[0] > self._delivered_gen:
                    self._run = self._stopped_run
                self._stopped_run = None
            if task.on_error is not None:
                task.on_error(message)

        def progress(fraction: float, message: str) -> None:
            if fresh() and task.on_progress is not None:
                task.on_progress(fraction, message)

        def finished() -> None:
            # the finished worker is not held from here: its signals' handlers (these closures) hold this job, so
            # a job that kept its worker would keep the worker's arguments, the model among them, for ever
            job.parts = job.worker = None
            if began:  # it ran (see `work`)
                self._spans.append((MAIN_NAMES[kind], began[0], time.perf_counter()))
            if self._current is job:
                self._current = None
            self._next()

        fn = task.fn
        if task.on_partial is not None:  # a part is dropped as a result is: stopped job, older run, old model
            on_partial = task.on_partial

            def part(value: Any) -> None:
                if fresh() and not (kind == "run" and gen <= self._delivered_gen):
                    on_partial(value)

            job.parts = _Parts()
            job.parts.sent.connect(part, Qt.ConnectionType.QueuedConnection)
            fn = bind(task.fn, partial=job.parts.sent.emit)
        job.worker = launch(fn, *task.args, on_result=result, on_error=error,
                            on_progress=progress if task.on_progress is not None else None, on_finished=finished,
                            on_started=lambda: began.append(time.perf_counter()))

    def _stop(self, job: _InFlight) -> None:
        job.cancelled = True
        if job.worker is not None:
            job.worker.quit()

    def _update_busy(self) -> None:
        if self.busy != self._busy:
            self._busy = self.busy
            self.busy_changed.emit(self._busy)
