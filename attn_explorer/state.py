"""The session: which model is open, what input it sees, what the views have selected.

`SessionState` is the one QObject that views read and write. It owns the torch model object but never
runs it in the GUI thread: loading and running go through `attn_explorer.workers`, one job at a time,
and only `ModelInfo` / `RunResult` (NumPy arrays and plain data) come back. The model package itself
(`attn_explorer.load_model`, and with it torch) is imported lazily inside the worker, so the window
can appear before torch is loaded.

Newest input wins: every request gets a generation number; while a run is in flight, later requests
collapse into one pending run, and a result older than the one on screen is dropped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PySide6.QtCore import QObject, QThreadPool, Signal, Slot

from attn_explorer.hub.result import ModelInfo, RunResult
from attn_explorer.workers import Worker

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


def _run_job(model: Any, x: Any, kwargs: dict, gen: int, epoch: int) -> tuple[int, int, RunResult]:
    r = model.run(x, **kwargs)
    return gen, epoch, r


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
        self.full_tokens: int = 0  # token count of the whole input, from the last uncut run
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
        # scheduling
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)  # one model job at a time
        self._gen = 0  # newest run request
        self._shown_gen = -1  # generation of the result on screen
        self._epoch = 0  # bumps on each successful model load
        self._load_epoch = 0  # bumps on each load request
        self._running = False
        self._pending = False
        self._loading = False
        self._jobs: set[Worker] = set()
        self.ready_at = 0.0

    # ----------------------------------------------------------------------------- properties
    @property
    def has_model(self) -> bool:
        return self._model is not None

    @property
    def busy(self) -> bool:
        return self._running or self._loading

    # ----------------------------------------------------------------------------- model
    def load_model(self, src: str | None = None, want_image: bool | None = None) -> None:
        """Load a model in the background. On success the current input is run again."""
        if want_image is None:
            want_image = self.input_kind == "image"
        self._load_epoch += 1
        self._loading = True
        self.busy_changed.emit(True)
        self.model_loading.emit(src or "")
        w = Worker(_load_job, self._loader, src, self.device, want_image, self._load_epoch)
        w.signals.progress.connect(self._on_load_progress)
        w.signals.result.connect(self._on_loaded)
        w.signals.error.connect(self._on_load_error)
        self._start(w)

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
        self.max_tokens = None
        self.image_size = None
        self.full_tokens = 0
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
        if self._model is not None and self._pending:
            self.request_run()

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
        if n is not None and self.full_tokens and n >= self.full_tokens:
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
        if self._model is None or self._loading or self._running:
            self._pending = True
            return
        self._start_run()

    def _start_run(self) -> None:
        self._pending = False
        x, kw = self.run_input()
        if x is None or (isinstance(x, str) and self.input_kind == "text" and not x.strip()):
            return  # nothing to show; keep the last good view
        self._running = True
        self.busy_changed.emit(True)
        w = Worker(_run_job, self._model, x, kw, self._gen, self._epoch)
        w.signals.result.connect(self._on_run_result)
        w.signals.error.connect(self._on_run_error)
        w.signals.finished.connect(self._on_run_finished)
        self._start(w)

    @Slot(object)
    def _on_run_result(self, out) -> None:
        gen, epoch, r = out
        if epoch != self._epoch or gen <= self._shown_gen:
            return  # stale: another model, or older than what is on screen
        if self.info is not None and self.result is not None and r.model != self.info.name:
            return
        self._shown_gen = gen
        self.timings.append((r.num_tokens, float(r.forward_ms)))
        del self.timings[:-400]
        if self.max_tokens is None and r.grid is None:
            self.full_tokens = r.num_tokens
        if not self._query_chosen:
            self.query = default_query(r)
        self.query = min(self.query, r.num_tokens - 1)
        self.result = r
        self.ready_at = time.perf_counter()  # render timing starts here
        self.attention_ready.emit(r)

    @Slot(str)
    def _on_run_error(self, message: str) -> None:
        self.error_raised.emit(message)

    @Slot()
    def _on_run_finished(self) -> None:
        self._running = False
        if self._pending and self._model is not None and not self._loading:
            self._start_run()
        if not self.busy:
            self.busy_changed.emit(False)

    def _start(self, w: Worker) -> None:
        self._jobs.add(w)
        w.signals.finished.connect(self._forget_jobs)
        w.start(self._pool)

    @Slot()
    def _forget_jobs(self) -> None:
        self._jobs = {j for j in self._jobs if j.signals is not self.sender()}

    def wait_idle(self, msecs: int = 30000) -> bool:
        """Block until queued jobs finish (tests, screenshots, shutdown)."""
        return self._pool.waitForDone(msecs)

    def shutdown(self) -> None:
        for w in list(self._jobs):
            w.cancel()
        self._pool.waitForDone(10000)


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
