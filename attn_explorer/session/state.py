"""The session: the input the user gives, the model that runs it, and what comes back.

`SessionState` is the one QObject that views read and write, through its past-tense signals. It holds
its parts: the input and options (`inputs.InputState`, as `state.inputs`: text or image, d_k, the cut,
the selection, the view options, each with its signal), the model (`host.ModelHost`, as `state.host`:
it loads and runs the model through its `Runner`, one model job at a time, newest request first, stale
results dropped), and the n sweep (`NSweep`, whose steps the runner fits in between runs). It turns each
change of input into a run, a re-pooling or a model switch, and keeps the result on screen; saved
sessions and saved runs come back through `saved.open_session` / `saved.open_result`. Only `ModelInfo`,
`RunResult` and the grid's already pooled mosaic (`grid_image`) come back, as NumPy arrays and plain
data. The model package itself (and with it torch) is imported inside the jobs, so the window can appear
before torch is loaded.
"""
from __future__ import annotations

import time
import weakref
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from attn_explorer.api.result import RunResult
from attn_explorer.session.host import ModelHost
from attn_explorer.session.inputs import DK_MAX, DK_MIN, SAMPLE_TEXT, InputState, default_query
from attn_explorer.session.jobs import Loaded, Loader, Ran, default_loader, parse_layers
from attn_explorer.session.run_watch import RunWatch
from attn_explorer.session.runner import SHARED_SHARE, Task
from attn_explorer.session.sweep import NSweep

__all__ = ["SessionState", "InputState", "Loaded", "default_loader", "default_query", "sample_images",
           "first_sample", "SAMPLE_TEXT", "DK_MIN", "DK_MAX"]


def _part(part: str, *names: str) -> tuple[property, ...]:
    """Properties that read (and, for plain fields, write) `names` of the part `part` (the views' many
    `state.layer`, `state.select(...)`, `state.text_changed` stay as they were)."""
    def one(name: str) -> property:
        return property(lambda self: getattr(getattr(self, part), name),
                        lambda self, value: setattr(getattr(self, part), name, value),
                        doc=f"`state.{part}.{name}`")
    return tuple(one(n) for n in names)


class SessionState(QObject):
    """The input and options (`inputs`), the model (`host`) and the n sweep (`sweep`). Views connect to
    its past-tense signals."""

    model_loading = Signal(str)  # what is being loaded ("" = the default)
    load_progressed = Signal(float, str)  # fraction, message
    model_loaded = Signal(object)  # ModelInfo
    models_listed = Signal(list)  # [(name, description)] of the built-in models
    attention_ready = Signal(object)  # RunResult, the newest one (its grid mosaic travels in `display`)
    error_raised = Signal(str)  # one line for the user
    busy_changed = Signal(bool)  # a load or a run is in flight or waiting
    sweep_started = Signal(int)  # number of sequence lengths to measure
    sweep_progressed = Signal(int, int)  # forward passes done, in all
    sweep_point_measured = Signal(int, float)  # n, median forward ms at that n
    sweep_finished = Signal(bool)  # True: every length measured; False: cancelled or failed
    run_progressed = Signal(int, int, str)  # layers done, layers in all, the run's line (run_watch; issue 24)
    pin_changed = Signal(bool)  # the model loaded now is pinned (kept in memory across switches) or not
    saved_run_shown = Signal(str)  # a saved run's maps are on screen without their model (its label, "run.npz")

    # the input part (InputState), reachable as before: its fields, signals and methods
    (info, result, text, target, image, input_kind, text_note, last_text_model, dk_scale, dk_layer_only,
     max_tokens, image_size, layer, head, query, _query_chosen, colormap, log_scale, hide_special, alpha, stack,
     colour_scale) = _part(
        "inputs", "info", "result", "text", "target", "image", "input_kind", "text_note", "last_text_model",
        "dk_scale", "dk_layer_only", "max_tokens", "image_size", "layer", "head", "query", "_query_chosen",
        "colormap", "log_scale", "hide_special", "alpha", "stack", "colour_scale")
    (text_changed, input_cleared, selection_changed, query_changed, options_changed, target_changed) = _part(
        "inputs", "text_changed", "input_cleared", "selection_changed", "query_changed", "options_changed",
        "target_changed")
    (has_input, set_text, set_target, set_image, set_dk_scale, set_dk_layer_only, set_max_tokens, set_image_size,
     run_input, shown_stack, stack_shape, layer_kinds, maps, select, step_layer, step_head, set_query,
     set_options) = _part(
        "inputs", "has_input", "set_text", "set_target", "set_image", "set_dk_scale", "set_dk_layer_only",
        "set_max_tokens", "set_image_size", "run_input", "shown_stack", "stack_shape", "layer_kinds", "maps",
        "select", "step_layer", "step_head", "set_query", "set_options")
    # the model part (ModelHost): the runner, the handle, the device and dtype the next load reads with
    runner, _model, builtins, device, dtype = _part("host", "runner", "model", "builtins", "device", "dtype")

    def __init__(self, loader: Loader | None = None, device: str = "auto", parent: QObject | None = None,
                 dtype: str = "float32"):
        super().__init__(parent)
        self.inputs = InputState(self)
        self.inputs.input_changed.connect(self._input_changed)
        self.host = ModelHost(loader, device, dtype, self)
        self.host.loading.connect(self.model_loading)
        self.host.load_progressed.connect(self.load_progressed)
        self.host.loaded.connect(self._on_loaded)
        self.host.load_failed.connect(self._on_load_error)
        self.runner.busy_changed.connect(self.busy_changed)
        self.watch = RunWatch()  # the run in flight, in words (model, tokens, layer k of L, elapsed, estimate)
        self.runner.busy_changed.connect(lambda busy: None if busy else self.watch.end())
        self.sweep = NSweep(self.runner, self)
        self.sweep.started.connect(self.sweep_started)
        self.sweep.progressed.connect(self.sweep_progressed)
        self.sweep.point_measured.connect(self.sweep_point_measured)
        self.sweep.finished.connect(self.sweep_finished)
        self.sweep.failed.connect(self.error_raised)
        # text: the most tokens whose maps fit in memory (newest run), and why the text on screen was cut
        self.fit_tokens: int | None = None
        self.cut_reason: str = ""
        self.result_asked_at = 0.0  # perf_counter of the request that made `result`
        # measured (n, forward_ms) of the runs shown: the cost plot
        self.timings: list[tuple[int, float]] = []
        self._shared: tuple | None = None  # (weakref to a result, {lane: seconds}): a run timed beside side jobs
        # where the time of the newest run went, in ms (benchmarks and the status bar read it)
        self.ready_at = 0.0  # perf_counter when the newest result reached the GUI thread
        self.run_timing: dict[str, float] = {}
        self._asked_at = 0.0  # perf_counter of the newest run request
        self._shown_from: tuple | None = None  # (model, input, run kwargs) that made `result`
        self._let_go_from: tuple | None = None  # (input, run kwargs) of it, while its model is let go for a load
        # a saved run shown without its model (saved.open_result): its label ("run.npz"), "" otherwise
        self.result_only: str = ""
        self._opened: RunResult | None = None  # that run as read, before its first pooling
        self._session: Any = None  # the session (saved.SavedSession) whose model is loading, to restore after
        self._session_note = ""  # a line to show once the restored session's run is on screen
        self._device_before = device  # the device preference before that session's load

    # ----------------------------------------------------------------------------- properties
    @property
    def has_model(self) -> bool:
        return self.host.model is not None

    @property
    def grid_image(self) -> Any:
        """The grid page's mosaic of `result` (api.display.GridImage): it travels with the result
        (`RunResult.display`), pooled in the worker that ran it; None when there is no result."""
        return self.result.display if self.result is not None else None

    @property
    def busy(self) -> bool:
        """A load or a user's run is in flight or waiting (the n sweep does not count: see `sweeping`)."""
        return self.runner.busy

    @property
    def sweeping(self) -> bool:
        return self.sweep.running

    # the n sweep's (n, median forward ms) per length measured, its repeats, and whether the text was repeated to
    # reach the longer lengths
    sweep_points, sweep_repeats, sweep_repeated_input = _part("sweep", "points", "repeats", "repeated_input")

    # ----------------------------------------------------------------------------- model
    def load_model(self, src: str | None = None, want_image: bool | None = None) -> None:
        """Load a model in the background. On success the current input is run again."""
        if want_image is None:
            want_image = self.input_kind == "image"
        self.sweep.cancel()  # its timings would belong to the old model
        self.host.load(src, want_image)  # model_loading, then model_loaded (_on_loaded) or an error line
        if self.host.let_go is not None:  # not pinned: what its runs kept goes with it (issue 24 D, memory)
            from attn_explorer.session.memory import let_go_runs

            let_go_runs(self)

    @property
    def pinned(self) -> bool:
        """The model loaded now is pinned: a switch to another keeps it in memory, and a switch back reads nothing."""
        return self.host.is_pinned()

    def set_pinned(self, on: bool) -> None:
        """Pin the model loaded now, or unpin it (then the next switch frees it)."""
        self.host.pin(bool(on), self.info)
        self.pin_changed.emit(self.pinned)

    def choose_model(self, src: str) -> bool:
        """The user chose `src` under Model: load it, unless it is the model loaded now (then nothing changes:
        its result, sweep and timings stay). Returns True when a load started."""
        info = self.info
        if (info is not None and self._model is not None and not self.result_only and not self.runner.loading
                and src == info.name and info.dtype == self.dtype):
            return False
        self.load_model(src, want_image=None)
        return True

    def set_dtype(self, dtype: str) -> None:
        """Read the current model again with its weights in dtype (float32, bfloat16 or float16); later
        loads use it too."""
        self.dtype = dtype
        if self.info is not None:
            self.load_model(self.info.name)

    def _on_loaded(self, loaded: Loaded) -> None:
        if self.host.came_back and self.info is not None and loaded.info.name == self.info.name:
            from attn_explorer.session.memory import came_back

            came_back(self)  # the model a failed load had let go, read again: the view stays
            return
        self._let_go_from = None
        self._shown_from = None  # let the old model go
        self.info = loaded.info
        if loaded.builtins:
            self.models_listed.emit(self.builtins)
        self.timings = []
        self.sweep.clear()
        self.fit_tokens = None
        self.max_tokens = None  # the new model reads as much of the text as it can (see jobs.run_job)
        self.image_size = None
        # images: start on the last layer, where [CLS] attention outlines objects (as in DINO)
        self.layer = self.info.num_layers - 1 if self.info.modality == "image" else min(self.layer, self.info.num_layers - 1)
        self.head = min(self.head, self.info.num_heads - 1)
        self._query_chosen = False
        self.result_only, self._opened = "", None
        if self.info.modality == "text":
            self.last_text_model = self.info.name
            self.input_kind = "text"
        else:
            self.input_kind = "image"
            if self.image is None:
                self.image = first_sample()
        self.model_loaded.emit(self.info)
        session, self._session = self._session, None
        if session is not None:
            from attn_explorer.session.saved import model_source, restore

            if model_source(self.info.name) == session.model:  # not a later load that replaced the session's
                restore(self, session)
        self.request_run()

    def _on_load_error(self, message: str) -> None:
        if self.info is not None:
            self.dtype = self.info.dtype  # a dtype that failed to load is not the one in use
        if self._session is not None:
            self._session, self._session_note = None, ""
            self.device = self._device_before
            message = f"cannot open the session: its model did not load: {message}"
        self.error_raised.emit(message)  # the old model stays, and so does its view

    # ----------------------------------------------------------------------------- input -> jobs
    def _input_changed(self, what: str) -> None:
        """A change of input or knobs (see `InputState`): switch model, clear, re-pool or run."""
        loading = self.runner.loading
        if self.result_only and what != "pooling" and not loading:
            shown = self.result if self.result is not None else self._opened
            if what in ("knob", "layer") and shown is not None:  # the knobs keep saying what the maps are
                self.dk_scale, self.max_tokens, self.image_size = float(shown.dk_scale), None, None
            self.error_raised.emit(f"{self.result_only} was opened without its model: choose a model to run "
                                   "the input again (d_k, the cut and a new input need it)")
            return
        # a vision-language model (issue 26 B) reads the picture and the prompt: neither switches the model
        if what == "text" and self.info is not None and self.info.modality not in ("text", "image-text") and not loading:
            self.load_model(self.last_text_model, want_image=False)
            return
        if what == "image" and self.info is not None and self.info.modality not in ("image", "image-text") and not loading:
            self.load_model(None, want_image=True)
            return
        if what == "text" and not self.has_input:
            self._clear()
            return
        self.request_run()

    def _clear(self) -> None:
        """The input is empty: drop the run in flight and the result, and say so (`input_cleared`)."""
        self.runner.cancel()
        had = self.result is not None
        self.result = None
        self._shown_from = None
        self.cut_reason = ""
        if had or self.info is not None:
            self.input_cleared.emit()

    # ----------------------------------------------------------------------------- running
    def request_run(self) -> None:
        """Run the current input. Requests made while a job is in flight collapse into one."""
        self._asked_at = time.perf_counter()
        self.runner.request(self._run_task)

    def _run_task(self) -> Task | None:
        """The run, as the runner starts it: the input and model of this moment."""
        if self._model is None and self.result_only:
            return self._saved_run_task()
        x, kw = self.run_input()
        if self._model is None or not self.has_input:
            return None  # nothing to show; keep the last good view
        if self._shown_from is not None and self.host.same_run(self._shown_from, (self._model, x, kw)):
            # the result on screen is this run's: only how it is drawn changed, so pool it again
            r = self.result
            return self.host.pool_task(r, self.hide_special, self.shown_stack,
                                       lambda redrawn: self._on_pooled(r, redrawn), self.error_raised.emit)
        asked, launched, source = self._asked_at, time.perf_counter(), (self._model, x, dict(kw))
        self.watch.start(self.info.name if self.info is not None else "", getattr(self.info, "num_layers", 0))
        return self.host.run_task(x, kw, self.hide_special, self.shown_stack,  # an encoder-decoder: its stack shown
                                  lambda ran: self._on_ran(ran, asked, launched, source), self.error_raised.emit,
                                  self._run_progress, lambda part: self._on_live(part, asked))

    # ----------------------------------------------------------------------------- the run in flight (issue 24)
    def _run_progress(self, fraction: float, message: str) -> None:
        layers = parse_layers(message)
        if layers is not None and self.watch.active:
            self.watch.update(*layers)
            self.run_progressed.emit(layers[0], layers[1], self.watch.line())

    def _on_live(self, part: Any, asked: float) -> None:
        """A long run's next layer is done (session.live_run.LivePart): the run so far goes on screen, its finished
        layers' heads drawn and readable, the rest blank; `incomplete(result)` says how far it is. `asked`: when
        its run was asked for (a banner older than that, a Stop's line say, goes with its first layer)."""
        if not self.has_input:
            return
        r = part.result
        self._shown_from = None  # not a whole run: an edit, Stop or a knob never re-pools it, it runs again
        if not self._query_chosen:
            self.query = default_query(r)
        self.query = min(self.query, r.num_tokens - 1)
        self.result, self.result_asked_at = r, asked
        self.ready_at = time.perf_counter()  # the GUI's share of this part starts here, not at the last whole run
        self.attention_ready.emit(r)

    def shared_cores(self, r: Any) -> dict[str, float]:
        """The side jobs (lane: seconds) that ran beside r's forward (runner.SHARED_SHARE of its time or more): its
        forward_ms is not the model's alone. {} for one that ran alone, and for any result but the newest run's."""
        return dict(self._shared[1]) if self._shared is not None and self._shared[0]() is r else {}

    def run_status(self) -> dict | None:
        """The run in flight (RunWatch.status): model, tokens, layer, layers, elapsed_s, left_s; None when idle."""
        return self.watch.status()

    def stop_run(self) -> None:
        """Stop: the run in flight ends between layers (core.progress), the waiting one is forgotten, and the
        last good view stays."""
        self.runner.cancel()
        self.watch.end()

    def _on_pooled(self, r: RunResult, redrawn: RunResult) -> None:
        if r is not self.result:
            return  # another result arrived meanwhile
        self.result = redrawn
        if self._shared is not None and self._shared[0]() is r:
            self._shared = (weakref.ref(redrawn), self._shared[1])
        self.ready_at = time.perf_counter()
        self.attention_ready.emit(redrawn)  # the same run, with its mosaic pooled anew

    def _on_ran(self, ran: Ran, asked: float, launched: float, source: tuple) -> None:
        arrived = time.perf_counter()
        self.watch.end()
        if not self.has_input:
            return  # the input was cleared after this run started
        r = ran.result
        self._shown_from = source
        shared = self.runner.work(ran.started, ran.forward_done, share=SHARED_SHARE, exclude=("model-run",))
        self._shared = (weakref.ref(r), shared) if shared else None  # weak: a switch frees the run's maps
        # a first pass's start-up costs, or a forward that shared the cores, say nothing about how time grows with n
        if not r.warm_up and not shared:
            self.timings.append((r.num_tokens, float(r.forward_ms)))
            del self.timings[:-400]
        if not self._query_chosen:
            self.query = default_query(r)
        self.query = min(self.query, len(self.maps(r).rows) - 1)
        self.result = r
        self.result_asked_at = asked
        self.fit_tokens = ran.fit_tokens
        self.cut_reason = ran.cut
        self.ready_at = arrived  # the GUI's share starts here
        forward = float(r.forward_ms)
        self.run_timing = {"waited": (launched - asked) * 1000,  # behind another job
                           "to_worker": (ran.started - launched) * 1000,
                           "forward": forward,
                           "run_other": (ran.forward_done - ran.started) * 1000 - forward,  # tokenise, copy out
                           "pool": (ran.ended - ran.forward_done) * 1000,  # grid mosaic, in the worker
                           "hand_back": (arrived - ran.ended) * 1000}
        self.attention_ready.emit(r)
        if self._session_note:  # after the result, so that its arrival does not hide the banner at once
            note, self._session_note = self._session_note, ""
            self.error_raised.emit(note)

    # ----------------------------------------------------------------------------- sessions, saved runs
    def open_session(self, session: Any) -> bool:
        """Come back to a saved session (saved.SavedSession); see `saved.open_session`. Returns True when a
        model load started."""
        from attn_explorer.session.saved import open_session

        return open_session(self, session)

    def open_result(self, run: Any) -> None:
        """Show a saved run (reopen.SavedRun) without its model; see `saved.open_result`."""
        from attn_explorer.session.saved import open_result

        open_result(self, run)

    def _saved_run_task(self) -> Task | None:
        from attn_explorer.session.saved import saved_run_task

        return saved_run_task(self)

    # ----------------------------------------------------------------------------- n sweep
    def start_sweep(self, repeats: int = 3, lengths: list[int] | None = None) -> bool:
        """Time the current model at log-spaced n (see `sweep.sweep_lengths`), `repeats` runs per n.

        Points stream out through `sweep_point_measured` (median of the repeats). Returns False when
        there is nothing to measure (no model or no input)."""
        if self._model is None or self.info is None or self.runner.loading:
            return False
        x, kw = self.run_input()
        return self.sweep.start(self._model, self.info, x, kw, self.result, repeats, lengths)

    def submit(self, fn, *args, key: str, on_result=None, on_error=None, on_yield=None, on_progress=None,
               uses_model: bool = True) -> bool:
        """Run a side job in lane `key` (a lesson's numbers, an analysis), newest wins (`Runner.submit`).

        With uses_model (the default) it is `fn(model, *args)` on the current model, and False is returned
        (nothing starts) when there is none; without, it is `fn(*args)` (pure calculations, kept off the GUI
        thread). A generator function streams through on_yield. Errors arrive as one line through on_error,
        or as `error_raised` when none is given. `cancel(key)` stops it. After `shutdown` nothing starts: a
        page's timer that fires while its window closes would otherwise start a job whose answer reaches
        deleted widgets."""
        return self.host.submit(fn, *args, key=key, on_result=on_result, on_error=on_error or self.error_raised.emit,
                                on_yield=on_yield, on_progress=on_progress, uses_model=uses_model)

    def cancel(self, key: str) -> None:
        """Stop lane `key`'s jobs: no answer of them arrives."""
        self.runner.cancel_lane(key)

    def job_busy(self, key: str) -> bool:
        """A job of lane `key` is in flight or waiting."""
        return self.runner.lane_busy(key)

    def cancel_sweep(self) -> None:
        """Stop the sweep: no more steps start, and the one in flight reports nothing."""
        self.sweep.cancel()

    def shutdown(self, wait: bool = True) -> None:
        """Stop every job; wait for the pool (tests, the self-test), or not (closing the window: it goes at
        once, and a forward pass in flight ends on its own with its result dropped; run_gui waits for it)."""
        self.sweep.cancel()
        self.host.shutdown(wait)  # no side job starts any more (submit)
        # a session that was shut down tells nobody anything: the views connected to it may be gone, and a
        # job that ends later (its busy flag, a queued result) must not call into their deleted widgets
        self.blockSignals(True)
        self.inputs.blockSignals(True)


def first_sample() -> str | None:
    paths = sample_images()
    return str(paths[0]) if paths else None


def sample_images() -> list[Path]:
    from attn_explorer.resources import resource_path

    d = resource_path("samples")
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
