"""The session: which model is open, what input it sees, what the views have selected.

`SessionState` is the one QObject that views read and write. It owns the torch model object but never
runs it in the GUI thread: loading and running go through `attn_explorer.session.workers`, one job at a time,
and only `ModelInfo` / `RunResult` (NumPy arrays and plain data) come back. The model package itself
(`attn_explorer.load_model`, and with it torch) is imported lazily inside the worker, so the window
can appear before torch is loaded.

Newest input wins: every request gets a generation number; while a run is in flight, later requests
collapse into one pending run, and a result older than the one on screen is dropped.

The n sweep times the current model at several sequence lengths, one forward pass per job on the same
one-job pool. A user's run always goes before the next sweep step, so typing during a sweep is served
after at most one sweep forward pass. Sweep runs only report (n, forward ms): they never change the
attention on screen.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PySide6.QtCore import QObject, QThreadPool, Signal, Slot

from attn_explorer.api.result import ModelInfo, RunResult
from attn_explorer.session.workers import await_workers, launch

SAMPLE_TEXT = "The animal didn't cross the street because it was too tired."
DEFAULT_TEXT_MODEL = "minilm"
DK_MIN, DK_MAX = 0.05, 20.0

# loader(src, device, progress, want_image) -> Loaded. src None means "the default model".
Loader = Callable[..., "Loaded"]


@dataclass
class Loaded:
    """What a load job hands back to the GUI thread."""

    model: Any  # the model object (holds torch tensors); only ever used from worker threads
    info: ModelInfo
    builtins: list[tuple[str, str]] = field(default_factory=list)  # (name, description)


def default_loader(src: str | None, device: str = "auto", progress=None, want_image: bool = False) -> Loaded:
    """Load through the public model API. Runs in a worker thread: torch is imported here."""
    import attn_explorer as ax

    if not src:
        src = ax.default_image_model() if want_image else DEFAULT_TEXT_MODEL
    model = ax.load_model(src, device=device, progress=progress)
    try:
        builtins = [(str(n), str(d)) for n, d in ax.builtin_models()]
    except Exception:  # noqa: BLE001 - a missing list must not fail the load
        builtins = []
    return Loaded(model=model, info=model.info, builtins=builtins)


def _run_job(model: Any, x: Any, kwargs: dict, gen: int, epoch: int) -> tuple[int, int, RunResult, float, float]:
    t0 = time.perf_counter()
    r = model.run(x, **kwargs)
    return gen, epoch, r, t0, time.perf_counter()


def _sweep_job(model: Any, x: Any, kw: dict, want: int, reps: int, sweep_id: int) -> tuple[int, int, float, bool]:
    """One timed forward pass at sequence length `want`. Text shorter than `want` tokens is repeated
    `reps` times (more if that was too few) and cut with max_tokens. Returns (id, n, forward ms, repeated)."""
    if "max_tokens" not in kw:  # image: the size is already in kw
        r = model.run(x, **kw)
        return sweep_id, r.num_tokens, float(r.forward_ms), False
    while True:
        text = " ".join([x] * reps)
        r = model.run(text, **kw)
        if r.num_tokens >= want or r.total_tokens > r.num_tokens or reps >= 1 << 14:
            return sweep_id, r.num_tokens, float(r.forward_ms), reps > 1
        reps *= 2


def sweep_lengths(info: ModelInfo, points: int = 9) -> list[int]:
    """Text: log-spaced token counts from 8 to the model's max positions.
    Image: log-spaced patch-grid sides from 4 to twice the default grid (square images)."""
    if info.modality == "image" and info.patch_size:
        default = max(4, (info.image_size or 224) // info.patch_size)
        return sorted({int(round(g)) for g in np.geomspace(4, 2 * default, points - 1)})
    top = max(9, int(info.max_positions))
    return sorted({int(round(n)) for n in np.geomspace(8, top, points)})


def _load_job(loader: Loader, src, device, want_image, epoch, progress=None):
    return epoch, loader(src, device=device, progress=progress, want_image=want_image)


class SessionState(QObject):
    """Current model, input, result and selection. Views connect to its past-tense signals."""

    model_loading = Signal(str)  # what is being loaded ("" = the default)
    load_progressed = Signal(float, str)  # fraction, message
    model_loaded = Signal(object)  # ModelInfo
    models_listed = Signal(list)  # [(name, description)] of the built-in models
    attention_ready = Signal(object)  # RunResult, the newest one
    selection_changed = Signal(int, int)  # layer, head
    query_changed = Signal(int)  # token index of the query
    options_changed = Signal()  # colormap, log scale, hide specials, overlay alpha
    error_raised = Signal(str)  # one line for the user
    busy_changed = Signal(bool)  # a job is running
    sweep_started = Signal(int)  # number of sequence lengths to measure
    sweep_progressed = Signal(int, int)  # forward passes done, in all
    sweep_point_measured = Signal(int, float)  # n, median forward ms at that n
    sweep_finished = Signal(bool)  # True: every length measured; False: cancelled or failed

    def __init__(self, loader: Loader | None = None, device: str = "auto", parent: QObject | None = None):
        super().__init__(parent)
        self._loader = loader or default_loader
        self.device = device
        self._model: Any = None
        self.info: ModelInfo | None = None
        self.result: RunResult | None = None
        self.builtins: list[tuple[str, str]] = []
        # input
        self.text: str = SAMPLE_TEXT
        self.image: Any = None  # a file path (str) or a PIL image
        self.input_kind: str = "text"  # "text" or "image"
        self.last_text_model: str = DEFAULT_TEXT_MODEL
        # knobs that change the run
        self.dk_scale: float = 1.0
        self.dk_layer_only: bool = False
        self.max_tokens: int | None = None  # text: keep the first n tokens
        self.image_size: int | None = None  # image: square side in pixels
        # selection and view options
        self.layer: int = 0
        self.head: int = 0
        self.query: int = 0
        self._query_chosen = False
        self.colormap: str = "viridis"
        self.log_scale: bool = False
        self.hide_special: bool = False
        self.alpha: float = 0.55
        # measured (n, forward_ms) for the current model: the cost plot
        self.timings: list[tuple[int, float]] = []
        # the n sweep: (n, median forward ms) per measured length, and what was measured
        self.sweep_points: list[tuple[int, float]] = []
        self.sweep_repeats = 3
        self.sweep_repeated_input = False  # the text was repeated to reach the longer lengths
        self._sweep_id = 0
        self._sweep_queue: list[tuple[Any, dict, int, int, bool]] = []  # (x, kw, want, reps, warm-up)
        self._sweep_worker: Any = None  # the step in flight
        self._sweep_step: tuple[int, int, bool] | None = None  # its (sweep id, wanted n, warm-up)
        self._sweep_samples: dict[int, list[float]] = {}
        self._sweep_done = 0
        self._sweep_total = 0
        # scheduling
        self._gen = 0  # newest run request
        self._shown_gen = -1  # generation of the result on screen
        self._epoch = 0  # bumps on each successful model load
        self._load_epoch = 0  # bumps on each load request
        self._running = False
        self._pending = False
        self._loading = False
        self.ready_at = 0.0
        self._requested_at = 0.0
        self.run_timing: dict[str, float] = {}

    # ----------------------------------------------------------------------------- properties
    @property
    def has_model(self) -> bool:
        return self._model is not None

    @property
    def busy(self) -> bool:
        """A load or a user's run is in flight (the n sweep does not count: see `sweeping`)."""
        return self._running or self._loading

    @property
    def sweeping(self) -> bool:
        """An n sweep is under way (a cancelled step may still be finishing in the pool)."""
        w = self._sweep_worker
        return bool(self._sweep_queue) or (w is not None and self._sweep_step[0] == self._sweep_id)

    # ----------------------------------------------------------------------------- model
    def load_model(self, src: str | None = None, want_image: bool | None = None) -> None:
        """Load a model in the background. On success the current input is run again."""
        if want_image is None:
            want_image = self.input_kind == "image"
        self.cancel_sweep()  # its timings would belong to the old model
        self._load_epoch += 1
        self._loading = True
        self.busy_changed.emit(True)
        self.model_loading.emit(src or "")
        launch(_load_job, self._loader, src, self.device, want_image, self._load_epoch,
               on_progress=self._on_load_progress, on_result=self._on_loaded, on_error=self._on_load_error)

    @Slot(float, str)
    def _on_load_progress(self, fraction: float, message: str) -> None:
        self.load_progressed.emit(fraction, message)

    @Slot(object)
    def _on_loaded(self, out) -> None:
        epoch, loaded = out
        if epoch != self._load_epoch:  # a newer load was asked for
            return
        self._loading = False
        self._model = loaded.model
        self.info = loaded.info
        self._epoch += 1
        if loaded.builtins:
            self.builtins = loaded.builtins
            self.models_listed.emit(self.builtins)
        self.timings = []
        self.sweep_points = []
        self.max_tokens = None
        self.image_size = None
        # images: start on the last layer, where [CLS] attention outlines objects (as in DINO)
        self.layer = self.info.num_layers - 1 if self.info.modality == "image" else min(self.layer, self.info.num_layers - 1)
        self.head = min(self.head, self.info.num_heads - 1)
        self._query_chosen = False
        if self.info.modality == "text":
            self.last_text_model = self.info.name
            self.input_kind = "text"
        else:
            self.input_kind = "image"
            if self.image is None:
                self.image = first_sample()
        self.model_loaded.emit(self.info)
        self.busy_changed.emit(self.busy)
        self.request_run()

    @Slot(str)
    def _on_load_error(self, message: str) -> None:
        self._loading = False
        self.busy_changed.emit(self.busy)
        self.error_raised.emit(message)
        self._next_job()

    # ----------------------------------------------------------------------------- input
    def set_text(self, text: str) -> None:
        self.text = text
        self.input_kind = "text"
        if self.info is not None and self.info.modality != "text" and not self._loading:
            self.load_model(self.last_text_model, want_image=False)
            return
        self.request_run()

    def set_image(self, image: Any) -> None:
        """Show an image (a path or a PIL image); switches to the default image model if needed."""
        self.image = str(image) if isinstance(image, Path) else image
        self.input_kind = "image"
        self._query_chosen = False
        self.query = 0
        if self.info is not None and self.info.modality != "image" and not self._loading:
            self.load_model(None, want_image=True)
            return
        self.request_run()

    def set_dk_scale(self, scale: float, layer_only: bool | None = None) -> None:
        scale = float(min(max(scale, DK_MIN), DK_MAX))
        if layer_only is not None:
            self.dk_layer_only = bool(layer_only)
        if scale == self.dk_scale and layer_only is None:
            return
        self.dk_scale = scale
        self.request_run()

    def set_dk_layer_only(self, only: bool) -> None:
        if bool(only) != self.dk_layer_only:
            self.dk_layer_only = bool(only)
            if self.dk_scale != 1.0:
                self.request_run()

    def set_max_tokens(self, n: int | None) -> None:
        total = self.result.total_tokens if self.result is not None and self.result.grid is None else 0
        if n is not None and total and n >= total:
            n = None
        if n != self.max_tokens:
            self.max_tokens = n
            self.request_run()

    def set_image_size(self, side: int | None) -> None:
        if side != self.image_size:
            self.image_size = side
            self.request_run()

    # ----------------------------------------------------------------------------- selection
    def select(self, layer: int | None = None, head: int | None = None) -> None:
        if self.info is None:
            return
        L, H = self.info.num_layers, self.info.num_heads
        new_layer = self.layer if layer is None else int(layer) % L
        new_head = self.head if head is None else int(head) % H
        if (new_layer, new_head) == (self.layer, self.head):
            return
        layer_moved = new_layer != self.layer
        self.layer, self.head = new_layer, new_head
        self.selection_changed.emit(self.layer, self.head)
        if layer_moved and self.dk_layer_only and self.dk_scale != 1.0:
            self.request_run()

    def step_layer(self, delta: int) -> None:
        if self.info is not None:
            self.select(layer=max(0, min(self.info.num_layers - 1, self.layer + delta)))

    def step_head(self, delta: int) -> None:
        if self.info is not None:
            self.select(head=max(0, min(self.info.num_heads - 1, self.head + delta)))

    def set_query(self, index: int) -> None:
        n = self.result.num_tokens if self.result is not None else 0
        if n == 0:
            return
        index = int(max(0, min(n - 1, index)))
        self._query_chosen = True
        if index != self.query:
            self.query = index
            self.query_changed.emit(index)

    def set_options(self, **kw) -> None:
        """colormap=, log_scale=, hide_special=, alpha=; emits options_changed once."""
        changed = False
        for k, v in kw.items():
            if not hasattr(self, k) or k not in ("colormap", "log_scale", "hide_special", "alpha"):
                raise AttributeError(k)
            if getattr(self, k) != v:
                setattr(self, k, v)
                changed = True
        if changed:
            self.options_changed.emit()

    # ----------------------------------------------------------------------------- running
    def run_input(self) -> tuple[Any, dict]:
        """What the next run sees: the input object and Model.run keyword arguments."""
        kw: dict = {"dk_scale": self.dk_scale}
        if self.dk_layer_only and self.dk_scale != 1.0:
            kw["dk_layers"] = [self.layer]
        if self.input_kind == "image":
            if self.image_size is not None:
                kw["image_size"] = int(self.image_size)
            return self.image, kw
        if self.max_tokens is not None:
            kw["max_tokens"] = int(self.max_tokens)
        return self.text, kw

    def request_run(self) -> None:
        """Run the current input. Requests made while a run is in flight collapse into one."""
        self._gen += 1
        self._pending = True
        self._next_job()

    def _next_job(self) -> None:
        """Start the next job if the pool is free: a pending user run first, then a sweep step."""
        if self._model is None or self._loading or self._running or self._sweep_worker is not None:
            return
        if self._pending and self._start_run():
            return
        if self._sweep_queue:
            self._start_sweep_step()

    def _start_run(self) -> bool:
        self._pending = False
        x, kw = self.run_input()
        if x is None or (isinstance(x, str) and self.input_kind == "text" and not x.strip()):
            return False  # nothing to show; keep the last good view
        self._running = True
        self._requested_at = time.perf_counter()
        self.busy_changed.emit(True)
        launch(_run_job, self._model, x, kw, self._gen, self._epoch, on_result=self._on_run_result,
               on_error=self._on_run_error, on_finished=self._on_run_finished)
        return True

    @Slot(object)
    def _on_run_result(self, out) -> None:
        gen, epoch, r, t_start, t_end = out
        arrived = time.perf_counter()
        if epoch != self._epoch or gen <= self._shown_gen:
            return  # stale: another model, or older than what is on screen
        if self.info is not None and self.result is not None and r.model != self.info.name:
            return
        self._shown_gen = gen
        self.timings.append((r.num_tokens, float(r.forward_ms)))
        del self.timings[:-400]
        if not self._query_chosen:
            self.query = default_query(r)
        self.query = min(self.query, r.num_tokens - 1)
        self.result = r
        self.ready_at = arrived  # render timing starts here
        # where the time of this run went, in ms (benchmarks and the status bar read it)
        self.run_timing = {"queued": (t_start - self._requested_at) * 1000, "forward": float(r.forward_ms),
                           "run_other": (t_end - t_start) * 1000 - float(r.forward_ms),
                           "hand_back": (arrived - t_end) * 1000}
        self.attention_ready.emit(r)

    @Slot(str)
    def _on_run_error(self, message: str) -> None:
        self.error_raised.emit(message)

    @Slot()
    def _on_run_finished(self) -> None:
        self._running = False
        self._next_job()
        if not self.busy:
            self.busy_changed.emit(False)

    # ----------------------------------------------------------------------------- n sweep
    def start_sweep(self, repeats: int = 3, lengths: list[int] | None = None) -> bool:
        """Time the current model at log-spaced n (see `sweep_lengths`), `repeats` runs per n.

        Points stream out through `sweep_point_measured` (median of the repeats). Returns False when
        there is nothing to measure (no model or no input)."""
        if self._model is None or self.info is None or self._loading:
            return False
        self.cancel_sweep()
        x, kw = self.run_input()
        kw.pop("max_tokens", None)
        kw.pop("image_size", None)
        info = self.info
        lengths = sorted(set(lengths or sweep_lengths(info)))
        steps: list[tuple[Any, dict, int, int, bool]] = []
        if info.modality == "image":
            if x is None or not info.patch_size:
                return False
            for g in lengths:
                steps.append((x, {**kw, "image_size": g * info.patch_size}, g, 1, False))
            self.sweep_repeated_input = False
        else:
            x = self.text
            if not x.strip():
                return False
            lengths = [n for n in lengths if 1 <= n <= info.max_positions]
            r = self.result if self.result is not None and self.result.grid is None else None
            total = r.total_tokens if r is not None and r.total_tokens else 0
            extra = int(np.count_nonzero(r.special)) if r is not None else 0
            per_copy = max(1, total - extra)
            for n in lengths:
                reps = max(1, math.ceil((n - extra) / per_copy)) if total else 1
                steps.append((x, {**kw, "max_tokens": n}, n, reps, False))
            self.sweep_repeated_input = bool(total) and max(lengths, default=0) > total
        if not steps:
            return False
        steps = [steps[0][:4] + (True,)] + [s for s in steps for _ in range(max(1, repeats))]
        self._sweep_id += 1
        self.sweep_repeats = max(1, repeats)
        self.sweep_points = []
        self._sweep_samples = {}
        self._sweep_queue = steps
        self._sweep_done = 0
        self._sweep_total = len(steps) - 1
        self.sweep_started.emit(len(lengths))
        self._next_job()
        return True

    def cancel_sweep(self) -> None:
        """Stop the sweep: no more steps start, and the one in flight reports nothing."""
        if not self.sweeping:
            return
        self._sweep_queue = []
        self._sweep_id += 1
        if self._sweep_worker is not None:
            self._sweep_worker.quit()
        self.sweep_finished.emit(False)

    def _start_sweep_step(self) -> None:
        x, kw, want, reps, warm = self._sweep_queue.pop(0)
        self._sweep_step = (self._sweep_id, want, warm)
        self._sweep_worker = launch(_sweep_job, self._model, x, kw, want, reps, self._sweep_id,
                                    on_result=self._on_sweep_result, on_error=self._on_sweep_error,
                                    on_finished=self._on_sweep_step_finished)

    @Slot(object)
    def _on_sweep_result(self, out) -> None:
        sweep_id, n, ms, repeated = out
        w = self._sweep_worker
        if sweep_id != self._sweep_id or w is None or self._sweep_step[2]:
            return
        self.sweep_repeated_input = self.sweep_repeated_input or repeated
        samples = self._sweep_samples.setdefault(n, [])
        samples.append(ms)
        self._sweep_done += 1
        self.sweep_progressed.emit(self._sweep_done, self._sweep_total)
        nxt = self._sweep_queue[0] if self._sweep_queue else None
        if len(samples) >= self.sweep_repeats or nxt is None or nxt[2] != self._sweep_step[1]:
            point = (n, float(np.median(samples)))
            self.sweep_points = [p for p in self.sweep_points if p[0] != n] + [point]
            self.sweep_point_measured.emit(*point)

    @Slot(str)
    def _on_sweep_error(self, message: str) -> None:
        if self._sweep_worker is not None and self._sweep_step[0] == self._sweep_id:
            self._sweep_queue = []
            self._sweep_id += 1
            self.error_raised.emit(f"n sweep stopped: {message}")
            self.sweep_finished.emit(False)

    @Slot()
    def _on_sweep_step_finished(self) -> None:
        w, self._sweep_worker = self._sweep_worker, None
        finished_now = w is not None and self._sweep_step[0] == self._sweep_id and not self._sweep_queue
        self._next_job()
        if finished_now:
            self.sweep_finished.emit(True)

    def wait_idle(self, msecs: int = 30000) -> bool:
        """Block until queued jobs finish (tests, screenshots, shutdown)."""
        return QThreadPool.globalInstance().waitForDone(msecs)

    def shutdown(self) -> None:
        self._sweep_queue = []
        await_workers(10000)


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


def now_ms() -> float:
    return time.perf_counter() * 1000.0
