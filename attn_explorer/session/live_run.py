"""A long run's maps as they are computed (issue 24 C): the grid fills in layer by layer during the forward.

A lazy forward keeps each layer's q, k and row statistics (api.lazy) instead of its maps, and hands each layer's
store over as soon as that layer is done (core.progress.watching's `on_kept`, from BlockStack's own loop: no
second forward, no hook). `LiveFill`, called there in the run's worker thread, pools that layer's heads into
their cells of the grid's mosaic and sends a `LivePart` to the GUI thread: a RunResult whose store answers for
the layers done so far (`PartialStore`; a later layer is one line saying it has not been computed), and the
mosaic so far (heads still to come are NaN, drawn blank). The one-head view of a finished layer can so be opened
and zoomed while later layers run; a stopped run keeps what is done, `incomplete(r)` saying how much.

Only a whole run is filled in this way: when the forward reuses a kept prefix it computes the new rows only,
and the grid's own lane (session.long_view.overview_job) fills those in after it, from the previous overview.
What crosses to the GUI thread is NumPy and plain data; the stores' methods run torch in worker threads only.
Torch is imported inside the functions, so the window can appear before it is loaded.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from attn_explorer.maths import log_weights
from attn_explorer.session.long_view import overview_cell

CELL_MAX = 128  # one head's cell in the mosaic, as the grid's own fill (GridView asks overview_job for 128)


@dataclass(frozen=True)
class LivePart:
    """What one finished layer sends: the run so far (result.display: the mosaic so far), layers done and in all."""

    result: Any  # api.result.RunResult; its `lazy` is a PartialStore
    done: int
    total: int


def incomplete(r: Any) -> str:
    """"incomplete: layers 0–4 of 18" for a run shown while it is computed (or stopped part-way); "" otherwise."""
    store = getattr(r, "lazy", None)
    done, total = getattr(store, "done", None), getattr(store, "total", None)
    if done is None or total is None or done >= total:
        return ""
    return f"incomplete: layers 0–{done - 1} of {total}" if done else f"incomplete: no layer of {total} yet"


def _partial_store_class():
    from attn_explorer.api.lazy import LazyAttention
    from attn_explorer.errors import UserError

    class PartialStore(LazyAttention):
        """The layers of a run done so far, answering as LazyAttention for them; shape says the whole run's."""

        def __init__(self, layers: list, total: int, heads: int):  # empty before the first layer
            self.layers = list(layers)
            self.total, self.heads_all = int(total), int(heads)

        @property
        def done(self) -> int:
            return len(self.layers)

        @property
        def num_layers(self) -> int:
            return self.total

        @property
        def num_heads(self) -> int:
            return self.heads_all

        def _layer(self, layer: int):
            self._not_yet(layer)
            return super()._layer(layer)

        def _check(self, layer: int, head: int):
            self._not_yet(layer)
            return super()._check(layer, head)

        def _not_yet(self, layer: int) -> None:
            if self.done <= int(layer) < self.total:
                raise UserError(f"layer {int(layer)} has not been computed: this run has layers 0–{self.done - 1} of "
                                f"{self.total} so far")

    return PartialStore


class LiveFill:
    """The run job's on_kept: each whole layer's heads pooled into the mosaic, sent on through `send(LivePart)`."""

    def __init__(self, model: Any, x: Any, kwargs: dict, send: Callable[[LivePart], None], cell_max: int = CELL_MAX):
        self.model, self.x, self.kwargs, self.send, self.cell_max = model, x, kwargs, send, cell_max
        self.layers: list = []
        self.off = False  # not a whole run (a reused prefix), or not one these cells can be made for
        self.base: Any = None  # the RunResult every part copies (tokens, shape)
        self.mosaic: np.ndarray | None = None
        self.cell = 0
        self.started = time.perf_counter()

    @property
    def complete(self) -> bool:
        return not self.off and self.base is not None and len(self.layers) == self.base.lazy.total

    def __call__(self, layer: int, kept: Any) -> None:
        if self.off:
            return
        from attn_explorer.api.lazy import LazyAttention, LazyLayer

        one = LazyLayer(kept.q, kept.k, kept.lse, kept.options) if hasattr(kept, "lse") else kept
        if layer != len(self.layers) or int(getattr(one, "n", -1)) != int(getattr(one, "m", -2)):
            self.off = True  # the new rows of a reused prefix only: the grid's lane fills those in after the run
            return
        if self.base is None and not self._begin(one):
            return
        alone = LazyAttention([one])
        c, L = self.cell, self.base.lazy.total
        for h in range(one.heads):  # core.progress.check() runs between the tiles: Stop ends this too
            self.mosaic[layer * c:(layer + 1) * c, h * c:(h + 1) * c] = alone.attention(0, h, pool=c)
        self.layers.append(one)
        store = _partial_store_class()(self.layers, L, self.base.lazy.heads_all)
        w = self.mosaic.copy()
        from attn_explorer.api.display import GridImage

        grid = GridImage(weights=w, log_weights=log_weights(w), layers=L, heads=store.heads_all, cell=c)
        so_far = (time.perf_counter() - self.started) * 1000  # the forward so far (the panels read forward_ms)
        self.send(LivePart(dataclasses.replace(self.base, lazy=store, display=grid, forward_ms=so_far),
                           len(self.layers), L))

    def _begin(self, kept: Any) -> bool:
        """The run's tokens (tokenised as run tokenises them) and the empty mosaic, at the first layer."""
        from attn_explorer.api.result import NotKept, RunResult

        info = self.model.info
        prepare = getattr(self.model, "prepare", None)
        if info.modality != "text" or prepare is None:
            self.off = True
            return False
        prep = prepare(self.x, max_tokens=self.kwargs.get("max_tokens"))
        n = int(kept.n)
        if prep.tokens is None or len(prep.tokens) != n:
            self.off = True
            return False
        L, H = int(info.num_layers), int(info.num_heads)
        self.cell = c = overview_cell(n, self.cell_max)
        self.mosaic = np.full((L * c, H * c), np.nan, np.float32)
        store = _partial_store_class()([], L, H)
        self.base = RunResult(attentions=NotKept((L, H, n, n)), tokens=list(prep.tokens),
                              special=np.asarray(prep.special, dtype=bool), model=info.name,
                              dk_scale=float(self.kwargs.get("dk_scale", 1.0)), forward_ms=0.0,
                              total_tokens=int(prep.total_tokens or n), lazy=store)
        return True

    def final_grid(self, r: Any) -> Any:
        """The whole mosaic for the finished run r (None unless every layer was filled in and r is that run)."""
        if not self.complete or getattr(r, "sinks", None) is not None or not getattr(r, "is_lazy", False):
            return None  # gpt-oss's sink column: the grid's lane draws it with the cells
        if r.num_tokens != self.base.num_tokens:
            return None
        from attn_explorer.api.display import GridImage

        w = self.mosaic.copy()
        return GridImage(weights=w, log_weights=log_weights(w), layers=self.base.lazy.total,
                         heads=self.base.lazy.heads_all, cell=self.cell)
