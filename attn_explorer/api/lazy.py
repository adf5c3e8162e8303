"""`LazyAttention`: a long input's attention, kept as each layer's q, k and row statistics instead of maps.

Every head's map of a 32,768-token input would be L·H·n² floats (Gemma 3 270M: 309 GB). A run that keeps
per layer q (H, n, d), k (H_kv, n, d) and each row's log-sum-exp (H, n) instead (core.lazy; L·n·d numbers)
can hand back any part of any head's map exactly, when a view asks for it: a pooled picture of a whole
head, a full-resolution window, one query's row, one key's column.

The store's methods run torch (on the model's device): call them in worker threads, never in the GUI
thread. What they return is float32 NumPy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from attn_explorer.core import lazy as core_lazy
from attn_explorer.errors import UserError
from attn_explorer.validate import existing_head


@dataclass
class LazyLayer:
    """What one layer kept: q (B, H, N, d) after RoPE and norms, k (B, H_kv, M, d) before grouped-query
    repetition, both in the model's dtype; lse (B, H, N) float32; and how its logits are formed."""

    q: torch.Tensor
    k: torch.Tensor
    lse: torch.Tensor
    options: core_lazy.LayerOptions

    @property
    def nbytes(self) -> int:
        t = [self.q, self.k, self.lse] + ([self.options.mask] if self.options.mask is not None else [])
        return sum(x.numel() * x.element_size() for x in t)

    # what LazyAttention asks of every kept layer (a hybrid's recurrent layers keep other things: core.mamba2's
    # KeptMamba and core.deltanet's KeptDeltaNet have the same heads / n / m / tensors() and compute their views
    # themselves, `tile` and `pooled`)
    @property
    def heads(self) -> int:
        return int(self.q.shape[1])

    @property
    def n(self) -> int:
        return int(self.q.shape[-2])

    @property
    def m(self) -> int:
        return int(self.k.shape[-2])

    def tensors(self) -> list:
        return [self.q, self.k, self.lse, self.options.mask]


def _tensor_bytes(layers) -> int:
    """Bytes held, counting a tensor shared by several layers (a padding mask) once."""
    seen, total = set(), 0
    for layer in layers:
        for t in layer.tensors():
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


class LazyAttention:
    """Every head's attention of one run, computed on request from what each layer kept (batch row 0).

    >>> r = model.run(long_text)                      # r.is_lazy for a long input
    >>> r.attention(5, 2, pool=1024)                  # head 2 of layer 5, max-pooled to 1024 × 1024
    >>> r.attention(5, 2, rows=(900, 1156), cols=(0, 256))   # a window at full resolution
    >>> r.attention(5, 2, rows=4000)                  # query 4000's row; cols=j: key j's column
    """

    def __init__(self, layers: list[LazyLayer]):
        if not layers:
            raise ValueError("a lazy store needs at least one layer")
        self.layers = layers

    @classmethod
    def from_kept(cls, kept: dict) -> "LazyAttention":
        """From a lazy forward's {layer: core.hooks.KeptLayer} (core.hooks.Hooks(keep=True).kept)."""
        return cls([LazyLayer(c.q, c.k, c.lse, c.options) if hasattr(c, "lse") else c for _, c in sorted(kept.items())])

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return max(layer.heads for layer in self.layers)  # a hybrid's layers may have fewer

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(L, H, N, M): the shape the dense maps would have."""
        first = self.layers[0]
        return (self.num_layers, self.num_heads, first.n, first.m)

    @property
    def bytes_kept(self) -> int:
        """What the store holds: every layer's q, k and lse (and a padding mask, if any)."""
        return _tensor_bytes(self.layers)

    @property
    def dense_bytes(self) -> int:
        """What the maps themselves would take as float32 (L·H·N·M·4)."""
        L, H, N, M = self.shape
        return L * H * N * M * 4

    def window(self, layer: int) -> int | None:
        """The layer's sliding window (a local layer sees only its last `window` tokens), or None."""
        options = getattr(self._layer(layer), "options", None)
        return None if options is None else options.window

    def _layer(self, layer: int) -> LazyLayer:
        L, H, _, _ = self.shape
        if not 0 <= int(layer) < L:
            raise UserError(f"no layer {layer}: the run has layers 0..{L - 1}")
        return self.layers[int(layer)]

    def _check(self, layer: int, head: int) -> LazyLayer:
        L, H, _, _ = self.shape
        existing_head(layer, head, L, self.layers[int(layer)].heads if 0 <= int(layer) < L else H, "the run")
        return self.layers[int(layer)]

    def attention(self, layer: int, head: int, rows=None, cols=None, pool=None, reduce: str = "max",
                  progress: Callable[[int, int], None] | None = None,
                  stop: Callable[[], bool] | None = None) -> np.ndarray:
        """One head's map, or the part of it a view draws, as float32 NumPy (RunResult.attention's rules).

        rows / cols: None (all), an int (one query's row / one key's column: the result loses that axis),
        a slice or (start, stop). pool: None (full resolution), an int or (rows, cols): at most that many
        cells, each the max (reduce="max") or the mean ("mean") of the exact probabilities it covers.
        progress(done, total) and stop() (True: raise core.lazy.Stopped) serve long pooled requests.
        A full-resolution request is refused in one line when it would not fit in memory."""
        lz = self._check(layer, head)
        h = int(head)
        N, M = lz.n, lz.m
        if reduce not in ("max", "mean"):
            raise UserError(f"reduce must be 'max' or 'mean', got {reduce!r}")
        if not isinstance(lz, LazyLayer):  # a recurrent layer (core.mamba2.KeptMamba): its signed map's tiles
            return _recurrent_view(lz, h, rows, cols, pool, reduce, stop)
        with torch.inference_mode():
            if isinstance(rows, (int, np.integer)):
                one_col = isinstance(cols, (int, np.integer))  # one weight: only its own key is computed
                a = core_lazy.head_probs(lz.q, lz.k, lz.lse, lz.options, h, _one(rows, N, "row"),
                                         _one(cols, M, "column") if one_col else _span(cols))[0]
                return _numpy(a[0] if one_col else a)
            if isinstance(cols, (int, np.integer)):
                return _numpy(core_lazy.head_probs(lz.q, lz.k, lz.lse, lz.options, h, _span(rows),
                                                   _one(cols, M, "column"))[:, 0])
            if pool is None:
                r, c = core_lazy._span(_span(rows), N), core_lazy._span(_span(cols), M)
                _fits((r.stop - r.start) * (c.stop - c.start) * 4, lz.q.device)
                return _numpy(core_lazy.head_probs(lz.q, lz.k, lz.lse, lz.options, h, r, c))
            cells = _cells(pool)
            return _numpy(core_lazy.head_pooled(lz.q, lz.k, lz.lse, lz.options, h, cells, reduce, _span(rows),
                                                _span(cols), progress=progress, stop=stop))

    def __repr__(self) -> str:
        from attn_explorer.budget import human_bytes

        L, H, N, M = self.shape
        return f"LazyAttention(L={L}, H={H}, N={N}, kept {human_bytes(self.bytes_kept)})"


def _recurrent_view(lz, h: int, rows, cols, pool, reduce: str, stop) -> np.ndarray:
    """A recurrent layer's view (LazyAttention.attention's rules) from its `tile` and `pooled`."""
    from attn_explorer.maths import pool_edges

    N, M = lz.n, lz.m
    one_row, one_col = isinstance(rows, (int, np.integer)), isinstance(cols, (int, np.integer))
    r = slice(*_one(rows, N, "row")) if one_row else core_lazy._span(_span(rows), N)
    c = slice(*_one(cols, M, "column")) if one_col else core_lazy._span(_span(cols), M)
    with torch.inference_mode():
        if pool is None or one_row or one_col:
            _fits((r.stop - r.start) * (c.stop - c.start) * 4, lz.tensors()[0].device)
            a = lz.tile(h, r, c)
            return _numpy(a[0, 0] if one_row and one_col else a[0] if one_row else a[:, 0] if one_col else a)
        cr, cc = _cells(pool)

        def check():
            core_lazy._check_stop()  # the thread's watcher (a long run the user stops)
            if stop is not None and stop():
                raise core_lazy.Stopped("stopped")
        return _numpy(lz.pooled(h, pool_edges(max(1, r.stop - r.start), cr), pool_edges(max(1, c.stop - c.start), cc),
                                reduce, r, c, check))


def _span(x):
    """RunResult.attention's rows/cols (None, slice, (start, stop)) as core.lazy takes them."""
    if x is None or isinstance(x, slice):
        return x
    start, stop = x
    return (int(start), int(stop))


def _one(i, n: int, what: str) -> tuple[int, int]:
    i = _one_index(i, n, what)
    return (i, i + 1)


def _one_index(i, n: int, what: str = "index") -> int:
    i = int(i)
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        raise UserError(f"no {what} {i}: the map has {n} of them (0..{n - 1})")
    return j


def _cells(pool) -> tuple[int, int]:
    pr, pc = (pool, pool) if np.isscalar(pool) else pool
    pr, pc = int(pr), int(pc)
    if pr < 1 or pc < 1:
        raise UserError(f"pool must be a positive number of cells, got {pool!r}")
    return pr, pc


def _fits(nbytes: int, device) -> None:
    from attn_explorer.budget import default_budget, human_bytes

    budget = default_budget(device)
    if nbytes > budget:
        raise UserError(f"that window at full resolution would need {human_bytes(nbytes)}, more than the "
                        f"{human_bytes(budget)} that can be spared: ask for fewer rows and columns, or pool=...")


def _numpy(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.float().cpu().numpy(), dtype=np.float32)


def kept_bytes(n: int, m: int, layers: int, heads: int, kv_heads: int, head_dim: int, elem: int) -> int:
    """What a lazy run of n queries and m keys keeps: per layer q (H·n·d), k (H_kv·m·d) in the model's dtype
    (elem bytes) and lse (H·n float32)."""
    return layers * (heads * n * head_dim * elem + kv_heads * m * head_dim * elem + heads * n * 4)


def module_kept_bytes(module, n: int, layers: int, heads: int, kv_heads: int, head_dim: int, elem: int) -> int:
    """What a lazy run of n tokens keeps of `module`: kept_bytes per softmax layer; a recurrent mixer with its own
    `kept_bytes(n)` (core.deltanet's Gated DeltaNet: q, k, g, β in float32) says its own."""
    blocks = getattr(getattr(module, "blocks", None), "layers", None) or []
    own = [b.attn.kept_bytes(n) for b in blocks if hasattr(getattr(b, "attn", None), "kept_bytes")]
    return sum(own) + kept_bytes(n, n, layers - len(own), heads, kv_heads, head_dim, elem)
