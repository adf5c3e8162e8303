"""The lessons' jobs, for the GUI's lesson pages (so `gui/` never imports below `session/`).

Every function here runs in a worker, through `state.submit(fn, ..., key="lesson-<name>")`; each
takes and returns NumPy arrays and plain data only, so no tensor ever reaches the GUI thread. This
module imports torch (through the lessons): the window imports it only when the Lessons tab builds
its first page. The lessons' names and titles, needed earlier, are in `session.lesson_list`.

The train-vit lesson's model lives here, between jobs, in a registry keyed by a run number the page
holds (a plain int): the page never holds the trainer, and saving or loading is a job like the others.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from attn_explorer.api.probe import head_trace as _head_trace
from attn_explorer.lessons import (LESSONS, block, by_hand, coreference, inside_a_head, lesson_names, multi_head,
                                   no_softmax, order, projections, scaling, train_vit)

__all__ = ["LESSONS", "lesson_names", "block", "by_hand", "coreference", "inside_a_head", "multi_head", "order",
           "projections", "scaling", "train_vit", "head_trace", "hand_steps", "word_matrix", "project",
           "split_heads", "shuffle_check", "encoding", "scaling_curves", "trace_block", "stream_norms",
           "find_heads", "TrainControl", "Paused", "Resumed", "Finished", "new_run", "train", "save_trained",
           "load_trained", "trainer_of", "no_softmax", "no_softmax_compare", "no_softmax_costs"]


# ------------------------------------------------------------------------------------- 1. by hand
def hand_steps(query: list[list[str]], keys: list[list[str]], values: list[list[str]], temperature: float):
    """The tables' cell texts -> (HandSteps, the values as numbers). A bad cell is one UserError line."""
    q = by_hand.parse_table(query, "query")
    k = by_hand.parse_table(keys, "keys")
    v = by_hand.parse_table(values, "values")
    return by_hand.attend_by_hand(q, k, v, temperature), v


# ------------------------------------------------------------------------------------- 2. inside a head
def head_trace(model, x, layer: int, head: int, query: int, run_kw: dict):
    """`api.probe.head_trace` (a HeadTrace of NumPy arrays): the lessons floor may not import api/, nor may gui/."""
    return _head_trace(model, x, layer, head, query, **run_kw)


# ------------------------------------------------------------------------------------- 3, 4. words pages
def word_matrix(text: str) -> tuple[list[str], np.ndarray]:
    """The typed words and their fixed vectors, one row each (projections.word_vectors)."""
    return projections.word_vectors(text)


def project(x_texts: list[list[str]], seed: int):
    """X's cell texts and a seed -> (Projected, Weights): one head on X."""
    x = by_hand.parse_table(x_texts, "X")
    w = projections.random_weights(seed)
    return projections.project(x, w), w


def split_heads(x_texts: list[list[str]], seed: int, num_heads: int):
    """X's cell texts, a seed and h -> (MultiHead, Weights)."""
    x = by_hand.parse_table(x_texts, "X")
    w = projections.random_weights(seed)
    return multi_head.split_heads(x, w, num_heads), w


# ------------------------------------------------------------------------------------- 5. order
def shuffle_check(text: str, seed: int):
    return order.shuffle_check(text, seed=seed)


def encoding(n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(the sinusoidal table (n, dim), its dot products (n, n))."""
    pe = order.encoding_table(n, dim)
    return pe, pe @ pe.T


# ------------------------------------------------------------------------------------- 6. scaling
def scaling_curves(num_keys: int, seed: int):
    return scaling.scaling_curves(num_keys=num_keys, seed=seed)


# ------------------------------------------------------------------------------------- 7. block
def trace_block(text: str):
    return block.trace_block(text)


def stream_norms(model, x, run_kw: dict):
    return block.stream_norms(model, x, run_kw)


# ------------------------------------------------------------------------------------- 8. coreference
def find_heads(model, text: str, query: list[int], a: list[int], b: list[int], run_kw: dict):
    return coreference.find_heads(model, text, query, a, b, run_kw)


# ------------------------------------------------------------------------------------- 9. train a tiny ViT
class TrainControl:
    """Pause, resume and stop for one training run, asked from the GUI thread and obeyed by the worker
    between two optimizer steps (plain threading, no Qt, no torch)."""

    def __init__(self):
        self._go = threading.Event()
        self._go.set()
        self.stop_requested = False
        self.holding = False  # the worker is waiting here, between two steps (tests, read-outs)

    def pause(self) -> None:
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def stop(self) -> None:
        self.stop_requested = True
        self._go.set()

    @property
    def pause_requested(self) -> bool:
        return not self._go.is_set()

    def wait(self) -> None:
        self.holding = True
        try:
            self._go.wait()
        finally:
            self.holding = False


@dataclass
class Paused:
    """Yielded by `train` when the run holds still: the record of the step it holds at, with its
    [CLS] attention taken now (so every read-out on the page can show that one step)."""

    record: "train_vit.TrainRecord"


@dataclass
class Resumed:
    """Yielded by `train` when a paused run goes on."""

    steps: int


@dataclass
class Finished:
    """What `train` returns: the steps done, whether Stop ended the run, and (when it did) the record of
    the step it stopped at, with its [CLS] attention taken then."""

    steps: int
    stopped: bool
    record: "train_vit.TrainRecord | None" = None


_TRAINERS: dict[int, "train_vit.Trainer"] = {}
_RUN_IDS = itertools.count(1)
_LOCK = threading.Lock()


def new_run() -> int:
    """A number for a new training run or load (plain data the page keeps)."""
    return next(_RUN_IDS)


def _keep(run: int, trainer, replaces: int | None) -> None:
    with _LOCK:
        if replaces is not None and replaces != run:
            _TRAINERS.pop(replaces, None)  # freed here, in the worker
        if trainer is not None:
            _TRAINERS[run] = trainer


def trainer_of(run: int):
    """The Trainer of run `run` (the CLI, tests and the jobs below; never the GUI thread)."""
    with _LOCK:
        return _TRAINERS.get(run)


def train(run: int, settings, control: TrainControl, replaces: int | None = None) -> Iterator:
    """Build a Trainer here (in the worker) and train it: yields each TrainRecord, and Paused/Resumed
    when `control` holds the run; returns Finished(steps), with .stopped when Stop ended it."""
    _keep(run, None, replaces)  # the old model is freed here, in the worker, before the new one is built
    trainer = train_vit.Trainer(settings)
    _keep(run, trainer, None)
    for record in trainer.run():
        yield record
        if control.pause_requested and not control.stop_requested:
            yield Paused(_with_attention(trainer, record))
            control.wait()
            if not control.stop_requested:
                yield Resumed(trainer.steps)
        if control.stop_requested:
            return Finished(trainer.steps, True, _with_attention(trainer, record))
    return Finished(trainer.steps, False)


def _with_attention(trainer, record):
    """The record, with the examples' [CLS] attention at its step when it has none yet (the model has
    not moved since it was made: the worker is between two steps)."""
    if record.attention is None and trainer.model is not None:
        record = replace(record)  # the one yielded already belongs to the GUI thread
        images, _ = trainer.examples()
        with train_vit.one_thread():
            train_vit.snapshot(record, trainer.model, images)
    return record


def save_trained(run: int, path: str) -> tuple[str, float | None]:
    """Save run `run`'s model as .safetensors -> (the path written, its held-out accuracy)."""
    trainer = trainer_of(run)
    if trainer is None:
        from attn_explorer.errors import UserError

        raise UserError("there is no model to save yet: start training first")
    written = trainer.save(path)
    return str(written), trainer.test_acc


def load_trained(run: int, path: str, settings, replaces: int | None = None):
    """A saved tiny ViT as run `run` -> (trained, its one TrainRecord)."""
    trainer, record = train_vit.load_trained(path, settings)
    _keep(run, trainer, replaces)  # only a good file replaces the model on screen
    return bool(trainer.trained), record


# ------------------------------------------------------------------------------------- 10. without a softmax
def no_softmax_compare(text: str, decay: float, beta: float | None, seed: int):
    """One softmax head and one Gated DeltaNet head on the same q, k, v (lessons.no_softmax.Comparison)."""
    return no_softmax.compare(text, decay=decay, beta=beta, seed=seed)


def no_softmax_costs():
    """The cost table's rows (plain numbers, no torch)."""
    return no_softmax.cost_table()
