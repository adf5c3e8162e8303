"""A forward pass the caller can follow and stop: a per-thread watcher the layer loop and the lazy tiles call.

`watching(on_layer, stop)` sets, for the calling thread only, what `layer_done` and `check` call: the block
stack reports each finished layer (`on_layer(done, total, tokens)`), and both it and the lazy kernels' query
chunks and tiles ask `stop()` between steps, raising `Stopped` when it says so. Nothing is added to the
hook table (a hook would switch prefix reuse off), and no second forward runs: the loop that computes the
layers is the one that reports them. Without a watcher both calls are a thread-local read and return.

>>> with watching(lambda done, total, n: print(f"layer {done} of {total}"), stop=event.is_set):
...     r = model.run(text)        # raises Stopped between layers (or tiles) once event is set
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["Stopped", "watching", "layer_done", "check"]


class Stopped(Exception):
    """A forward or a long tile job was asked to stop (its `stop` callable returned True)."""


_local = threading.local()


@contextmanager
def watching(on_layer: Callable[[int, int, int], None] | None = None,
             stop: Callable[[], bool] | None = None,
             on_kept: Callable[[int, object], None] | None = None) -> Iterator[None]:
    """Within the block, this thread's forwards call on_layer(layers done, layers in all, tokens) after each
    layer, and raise Stopped between layers and between lazy tiles once stop() returns True. on_kept(layer,
    kept) gets what a lazy layer kept (core.hooks.KeptLayer, or a recurrent layer's store) as soon as that
    layer is done, before on_layer: a long run's maps can be drawn layer by layer (issue 24 C). Nests: within
    an inner block, what it leaves None is the outer watcher's (a job's stop flag, a run's layer report)."""
    before = getattr(_local, "watch", None)
    if before is not None:
        on_layer = on_layer if on_layer is not None else before[0]
        stop = stop if stop is not None else before[1]
        on_kept = on_kept if on_kept is not None else before[2]
    _local.watch = (on_layer, stop, on_kept)
    try:
        yield
    finally:
        _local.watch = before


def check() -> None:
    """Raise Stopped if this thread's watcher asks to stop (between layers, query chunks, tiles)."""
    watch = getattr(_local, "watch", None)
    if watch is not None and watch[1] is not None and watch[1]():
        raise Stopped("stopped")


def layer_done(done: int, total: int, tokens: int = 0, kept: object = None) -> None:
    """A layer of a forward has finished: tell the watcher (with what the layer kept, for a lazy forward: layer
    done - 1's store), then stop if it asks to."""
    watch = getattr(_local, "watch", None)
    if watch is None:
        return
    if kept is not None and watch[2] is not None:
        watch[2](int(done) - 1, kept)
    if watch[0] is not None:
        watch[0](int(done), int(total), int(tokens))
    check()
