"""The session: which model is open, and the jobs that load and run it (the job façade).

`SessionState` is the one QObject that views read and write, through its past-tense signals. It is
composed of the input and options (`inputs.InputState`: text or image, d_k, the cut, the selection,
the view options, each with its signal) and the job façade here: loading and running go through its
`Runner` (one model job at a time, newest request first, stale results dropped), the n sweep is an
`NSweep` whose steps the runner fits in between runs, and side jobs run in the runner's lanes (newest
wins per lane key). Only `ModelInfo`, `RunResult` and the grid's already pooled mosaic (`grid_image`)
come back, as NumPy arrays and plain data. The model package itself (and with it torch) is imported
inside the jobs, so the window can appear before torch is loaded.
"""
from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Signal

from attn_explorer.api.result import RunResult
from attn_explorer.session.inputs import DK_MAX, DK_MIN, SAMPLE_TEXT, InputState
from attn_explorer.session.jobs import Loaded, Loader, Ran, default_loader, load_job, pool_job, run_job
from attn_explorer.session.runner import Runner, Task
from attn_explorer.session.sweep import NSweep

__all__ = ["SessionState", "InputState", "Loaded", "default_loader", "default_query", "sample_images",
           "first_sample", "SAMPLE_TEXT", "DK_MIN", "DK_MAX"]


class SessionState(InputState):
    """The input and options (`InputState`) and the jobs that load and run the model. Views connect to
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
    saved_run_shown = Signal(str)  # a saved run's maps are on screen without their model (its label, "run.npz")

    def __init__(self, loader: Loader | None = None, device: str = "auto", parent: QObject | None = None,
                 dtype: str = "float32"):
        super().__init__(parent)
        self._loader = loader or default_loader
        self.device = device
        self.dtype = dtype  # what the next load reads the weights in: float32, bfloat16 or float16
        self.runner = Runner(self)
        self.runner.busy_changed.connect(self.busy_changed)
        self.sweep = NSweep(self.runner, self)
        self.sweep.started.connect(self.sweep_started)
        self.sweep.progressed.connect(self.sweep_progressed)
        self.sweep.point_measured.connect(self.sweep_point_measured)
        self.sweep.finished.connect(self.sweep_finished)
        self.sweep.failed.connect(self.error_raised)
        self._model: Any = None  # handle for the next job; only worker threads use it
        self.builtins: list[tuple[str, str]] = []
        # text: the most tokens whose maps fit in memory (newest run), and why the text on screen was cut
        self.fit_tokens: int | None = None
        self.cut_reason: str = ""
        self.result_asked_at = 0.0  # perf_counter of the request that made `result`
        # measured (n, forward_ms) of the runs shown: the cost plot
        self.timings: list[tuple[int, float]] = []
        # where the time of the newest run went, in ms (benchmarks and the status bar read it)
        self.ready_at = 0.0  # perf_counter when the newest result reached the GUI thread
        self.run_timing: dict[str, float] = {}
        self._asked_at = 0.0  # perf_counter of the newest run request
        self._shown_from: tuple | None = None  # (model, input, run kwargs) that made `result`
        # a saved run shown without its model (open_result): its label ("run.npz"), "" otherwise
        self.result_only: str = ""
        self._opened: RunResult | None = None  # that run as read, before its first pooling
        self._session: Any = None  # the session (saved.SavedSession) whose model is loading, to restore after
        self._session_note = ""  # a line to show once the restored session's run is on screen

    # ----------------------------------------------------------------------------- properties
    @property
    def has_model(self) -> bool:
        return self._model is not None

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

    @property
    def sweep_points(self) -> list[tuple[int, float]]:
        """(n, median forward ms) per length the sweep measured."""
        return self.sweep.points

    @sweep_points.setter
    def sweep_points(self, points: list[tuple[int, float]]) -> None:
        self.sweep.points = list(points)

    @property
    def sweep_repeats(self) -> int:
        return self.sweep.repeats

    @property
    def sweep_repeated_input(self) -> bool:
        """The text was repeated to reach the longer lengths."""
        return self.sweep.repeated_input

    # ----------------------------------------------------------------------------- model
    def load_model(self, src: str | None = None, want_image: bool | None = None) -> None:
        """Load a model in the background. On success the current input is run again."""
        if want_image is None:
            want_image = self.input_kind == "image"
        self.sweep.cancel()  # its timings would belong to the old model
        self.runner.load(Task(partial(load_job, dtype=self.dtype), (self._loader, src, self.device, want_image),
                              on_result=self._on_loaded,
                              on_error=self._on_load_error, on_progress=self.load_progressed.emit))
        self.model_loading.emit(src or "")

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
        self._model = loaded.model
        self._shown_from = None  # let the old model go
        self.info = loaded.info
        if loaded.builtins:
            self.builtins = loaded.builtins
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
        if what == "text" and self.info is not None and self.info.modality != "text" and not loading:
            self.load_model(self.last_text_model, want_image=False)
            return
        if what == "image" and self.info is not None and self.info.modality != "image" and not loading:
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
        if self._shown_from is not None and self._same_run(self._shown_from, (self._model, x, kw)):
            # the result on screen is this run's: only how it is drawn changed, so pool it again
            r = self.result
            stack = () if self.shown_stack == "encoder" else (self.shown_stack,)
            return Task(pool_job, (r, self.hide_special, *stack), on_result=lambda redrawn: self._on_pooled(r, redrawn),
                        on_error=self.error_raised.emit)
        asked, launched, source = self._asked_at, time.perf_counter(), (self._model, x, dict(kw))
        stack = () if self.shown_stack == "encoder" else (self.shown_stack,)  # an encoder-decoder's other maps
        return Task(run_job, (self._model, x, kw, self.hide_special, *stack),
                    on_result=lambda ran: self._on_ran(ran, asked, launched, source), on_error=self.error_raised.emit)

    @staticmethod
    def _same_run(a: tuple, b: tuple) -> bool:
        (model_a, x_a, kw_a), (model_b, x_b, kw_b) = a, b
        same_x = x_a == x_b if isinstance(x_a, str) and isinstance(x_b, str) else x_a is x_b
        return model_a is model_b and same_x and kw_a == kw_b

    def _on_pooled(self, r: RunResult, redrawn: RunResult) -> None:
        if r is not self.result:
            return  # another result arrived meanwhile
        self.result = redrawn
        self.ready_at = time.perf_counter()
        self.attention_ready.emit(redrawn)  # the same run, with its mosaic pooled anew

    def _on_ran(self, ran: Ran, asked: float, launched: float, source: tuple) -> None:
        arrived = time.perf_counter()
        if not self.has_input:
            return  # the input was cleared after this run started
        r = ran.result
        self._shown_from = source
        if not r.warm_up:  # a first pass's start-up costs say nothing about how time grows with n
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
        """Come back to a saved session (session.saved.SavedSession): load its model (unless it is the one
        loaded), then restore its input, sliders, options and selection, and run it once. A missing image
        or model folder is one UserError line, raised before anything changes; a changed image opens as
        it is now, with a line saying so. Returns True when a model load started."""
        from attn_explorer.session.saved import image_problem, model_problem, model_source, restore

        note = image_problem(session)
        model_problem(session)
        self._session_note = note
        info = self.info
        if (info is not None and self._model is not None and not self.result_only and not self.runner.loading
                and model_source(info.name) == session.model and info.dtype == session.dtype):
            restore(self, session)
            self.request_run()
            return False
        self._session, self._device_before = session, self.device
        self.device, self.dtype = session.device, session.dtype
        self.load_model(session.model, want_image=session.input_kind == "image")
        return True

    def open_result(self, run: Any) -> None:
        """Show a saved run (session.reopen.SavedRun) without its model: its maps on every page that only
        draws them; a page or slider that needs the model says so. The model loaded (if any) is let go:
        what is on screen is the file's, and a knob must not run another model on another input. Choosing
        a model leaves this mode. The view the run was saved from (layer, head, query, options) is restored."""
        from attn_explorer.session.saved import restore_view

        self.sweep.cancel()
        self.runner.release_model()  # no answer of a job started on the old model arrives over the saved run
        self._model, self._shown_from, self._session = None, None, None
        self.result, self._opened, self.result_only = None, run.result, run.label
        self.info = run.info
        self.timings, self.fit_tokens, self.cut_reason = [], None, ""
        self.max_tokens, self.image_size, self.dk_scale = None, None, float(run.result.dk_scale)
        self.input_kind = "image" if run.result.grid is not None else "text"
        if run.result.image is not None:  # the pixels the model saw: choosing a model runs it on them
            from PIL import Image

            self.image = Image.fromarray(run.result.image)
        from attn_explorer.session.reopen import tokens_text

        text = str(run.view.get("text") or tokens_text(run.result.tokens, run.result.special))
        if self.input_kind == "text" and text and text != self.text:
            self.text = text
            self.text_changed.emit(text)
        self.layer = self.info.num_layers - 1 if self.info.modality == "image" else min(self.layer, self.info.num_layers - 1)
        self.head = min(self.head, self.info.num_heads - 1)
        self._query_chosen = False
        self.model_loaded.emit(self.info)
        restore_view(self, run.view)
        self.request_run()

    def _saved_run_task(self) -> Task | None:
        """Pool the saved run's grid mosaic (again: hide specials, another stack) in a worker."""
        r = self.result if self.result is not None else self._opened
        if r is None:
            return None
        stack = () if self.shown_stack == "encoder" else (self.shown_stack,)
        return Task(pool_job, (r, self.hide_special, *stack), on_result=self._on_saved_run_pooled,
                    on_error=self.error_raised.emit)

    def _on_saved_run_pooled(self, redrawn: RunResult) -> None:
        if not self.result_only:
            return  # a model was loaded meanwhile
        if not self._query_chosen:
            self.query = default_query(redrawn)
        self.query = min(self.query, len(self.maps(redrawn).rows) - 1)
        self.result, self.result_asked_at = redrawn, self._asked_at
        self.ready_at = time.perf_counter()
        self.attention_ready.emit(redrawn)
        self.saved_run_shown.emit(self.result_only)

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
        if getattr(self, "_shut_down", False):
            return False
        if uses_model:
            if self._model is None:
                return False
            args = (self._model, *args)
        self.runner.submit(key, Task(fn, args, on_result=on_result, on_error=on_error or self.error_raised.emit,
                                     on_progress=on_progress, on_yield=on_yield), uses_model=uses_model)
        return True

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
        self._shut_down = True  # no side job starts any more (submit)
        self.sweep.cancel()
        self.runner.shutdown(10000 if wait else 0)
        # a session that was shut down tells nobody anything: the views connected to it may be gone, and a
        # job that ends later (its busy flag, a queued result) must not call into their deleted widgets
        self.blockSignals(True)
        self.runner.blockSignals(True)


def default_query(r: RunResult) -> int:
    """The query shown before the user picks one: [CLS] for images, "it" or the first word for text."""
    if r.grid is not None:
        return 0
    for i, t in enumerate(r.tokens):
        if t.strip().lstrip("Ġ▁").lower() == "it":
            return i
    plain = np.flatnonzero(~np.asarray(r.special, dtype=bool))
    return int(plain[0]) if plain.size else 0


def first_sample() -> str | None:
    paths = sample_images()
    return str(paths[0]) if paths else None


def sample_images() -> list[Path]:
    from attn_explorer.resources import resource_path

    d = resource_path("samples")
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
