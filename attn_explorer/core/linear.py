"""Linear layers with a fast path for CPU float32 (and native bfloat16) inference: a weight packed once.

Most of a small transformer's forward time on the CPU is spent in its matrix products (87% for
MiniLM at n = 16). F.linear hands each product to MKL, which repacks the weight on every call.
Packed once and reused, the weight saves that: oneDNN's reordered weight (about a third faster at
these shapes on an AMD EPYC) or, on an Intel CPU, MKL's own packed one (`path_choice`, below;
benchmarks/bench_forward.py). Layers that read the same input (Q, K and V) can share one packed
weight and so one product.

The packed copy is a cache, never the truth: the parameters stay ordinary nn.Linear weights (the
state_dict names the checkpoint maps onto, W_O for the per-head outputs), and the copy is rebuilt
whenever one of them is replaced, moved or changed in place (its version counter moves). Training
(autograd), other devices and other dtypes take plain F.linear. The cost is one extra copy of the
weights in memory, made on the first fast call.

oneDNN (not MKL) compiles and caches one kernel ("primitive") per input shape, up to 1,024 of them per process and
about half a megabyte each: a live text box that sent every length from 1 to 512 tokens through MiniLM
(four weight shapes) filled the cache and grew the process by ~500 MB (benchmarks/bench_memory_lengths.py).
So the input's rows are padded with zeros up to a bucket (`padded_rows`), the product runs on the padded
rows and the padding is sliced off again. Each output row depends on its own input row only, so the kept
rows are the same numbers (bit for bit on the machines tested; tests/core/test_linear.py allows 1e-6),
and oneDNN sees 32 row counts up to 512 instead of 512.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.bf16 import amx_bf16, cpu_vendor, native_bf16

_ONEDNN = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
)
_MKL = (
    torch.backends.mkl.is_available()
    and hasattr(torch.ops.mkl, "_mkl_linear")
    and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
)
_PACK_ROWS = 128  # oneDNN's batch-size hint for the layout (measured: no difference from 16 to 256 rows)

fast_path_enabled = True  # False forces F.linear everywhere (benchmarks compare both)
bucketing_enabled = True  # False gives oneDNN every row count as it comes (benchmarks/bench_memory_lengths.py)
# Issue 24 F: which prepacked product float32 takes. oneDNN's (`_linear_pointwise` on a reordered weight) was
# measured faster than F.linear on an AMD EPYC (MiniLM 0.71× transformers) and slower on an Intel Xeon with AMX
# (1.10× against 1.00×), where MKL's own packed product (`cblas_sgemm_compute` on a weight packed once, through
# torch.ops.mkl) beats both, and gives F.linear's numbers (both are MKL's sgemm; bit for bit at most shapes).
#   "auto"    MKL's packed product on an Intel CPU (`mkl_wins`), oneDNN's elsewhere; bfloat16 oneDNN's, but
#             F.linear from AMX_PLAIN_ROWS rows on an AMX CPU (below)
#   "packed"  oneDNN's; "mkl" MKL's; "plain" F.linear
#   "measure" the first fast call of each shape (input width, output width, post-op, short or long input) times
#             oneDNN's product against F.linear on its own input, interleaved, best of 5, and that shape keeps
#             the faster. Not a default: a one-token step (short input) and a full run (long input) can then
#             take different paths, and their logits differ by ~1.3e-5, past the 1e-5 that prefix reuse and the
#             KV cache are held to against a full recompute (tests/api/test_prefix.py, tests/core/test_llama.py).
# In float32 one process takes one path for all shapes, so no step and full run ever differ that way.
path_choice = "auto"


def mkl_wins() -> bool:
    """MKL's packed float32 product is the one to take here: an Intel CPU (MKL's own), with torch's MKL ops.
    By vendor, not by a timing at start-up: every process on a machine takes the same path (a frozen app and
    the source give the same numbers), and the choice costs nothing."""
    return _MKL and cpu_vendor() == "GenuineIntel"


# Issue 24 B: on an Intel Xeon with AMX-BF16 (2026-12-03, 2 threads, interleaved), oneDNN's prepacked bfloat16
# product took 1.0-1.45× F.linear's time at Gemma 3's shapes from 1,024 rows up (Gemma 3 270M's bfloat16 forward at
# 4,096 tokens: 4 % faster on F.linear, the same bits), and 0.65-0.95× below (1 to 512 rows). Both are oneDNN's
# AMX kernels: of 242 shapes and row counts tried (Gemma 3's, SmolLM2's, MiniLM's widths, 1 to 4,096 rows), 12 differ,
# by one bfloat16 step in at most 0.03 % of the entries, as F.linear's own answer for a row can with the rows beside
# it. On an AMD EPYC with avx512_bf16 and no AMX, the packed product was the faster (1.08×).
AMX_PLAIN_ROWS = 1024


def _path(dtype: torch.dtype, rows: int = 0) -> str:
    """The product `path_choice` gives this dtype at this many rows: "packed" (oneDNN's), "mkl", "measure" or
    "plain"."""
    choice = path_choice
    if choice == "auto":
        choice = "mkl" if dtype == torch.float32 and mkl_wins() else "packed"
        if dtype == torch.bfloat16 and rows >= AMX_PLAIN_ROWS and amx_bf16():
            choice = "plain"
    if choice == "mkl" and not (_MKL and dtype == torch.float32):
        choice = "packed"  # MKL packs float32 only: bfloat16 takes oneDNN's
    return choice


def _packs(dtype: torch.dtype) -> bool:
    """float32 always; bfloat16 where the CPU multiplies it natively (issue 24 B: measured 1.08× faster than
    F.linear at Gemma 3's shapes, AMD EPYC with avx512_bf16, and the gelu post-op rides in the same pass)."""
    return dtype == torch.float32 or (dtype == torch.bfloat16 and native_bf16())


_measured: dict[tuple, bool] = {}  # shape key -> whether the packed product won
_REPEATS = 5


def padded_rows(m: int) -> int:
    """The row count m is padded to: the next multiple of 8 up to 64, then of an eighth of the power of
    two at or above m (8 up to 128, 16 up to 256, 32 up to 512...). At most 7 extra rows up to 64 and
    12.5 % beyond, with 8 buckets per doubling: the shapes oneDNN compiles grow with log(n), not n."""
    if m <= 64:
        return max(8, -(-m // 8) * 8)
    step = 1 << ((m - 1).bit_length() - 4)
    return -(-m // step) * step


class PackedLinears:
    """One product for several linear layers that read the same input.

    Their weights are stacked along the output dimension and reordered once for oneDNN; calling
    returns each layer's output (views into one result), or None when the fast path does not apply
    and the caller should run the layers itself.
    """

    def __init__(self, layers: Sequence[nn.Linear]):
        self.layers = tuple(layers)
        self.sizes = [layer.out_features for layer in self.layers]
        self.clear()

    def clear(self) -> None:
        # One attribute, replaced whole: a worker thread never sees a new weight with an old bias.
        self._cache: tuple | None = None  # (sources, packed weight, bias); sources: (tensor, data_ptr, version)

    @property
    def is_packed(self) -> bool:
        return self._cache is not None

    def __getstate__(self) -> dict:
        # copies and pickles carry no cache: oneDNN's opaque tensors cannot be copied or saved
        return {**self.__dict__, "_cache": None}

    def _sources(self) -> list | None:
        src = []
        for layer in self.layers:
            for t in (layer.weight, layer.bias):
                if t is None:
                    src.append(None)
                elif t.is_inference():  # no version counter: an in-place change could not be seen
                    return None
                else:
                    src.append((t, t.data_ptr(), t._version))
        return src

    @staticmethod
    def _same(old: list, new: list) -> bool:
        for a, b in zip(old, new):
            if a is None or b is None:
                if a is not b:
                    return False
            elif a[0] is not b[0] or a[1] != b[1] or a[2] != b[2]:
                return False
        return True

    def _pack(self, src: list, kind: str) -> tuple:
        """(sources, packed weight, bias, kind, weight's shape) for oneDNN's product ("packed") or MKL's ("mkl")."""
        with torch.no_grad():
            ws = [layer.weight.detach() for layer in self.layers]
            whole = torch.cat(ws) if len(ws) > 1 else ws[0]
            if kind == "mkl":  # packed for any row count (the hint is only its layout's batch size)
                w = torch.ops.mkl._mkl_reorder_linear_weight(whole, _PACK_ROWS)
            else:
                w = torch.ops.mkldnn._reorder_linear_weight(whole, _PACK_ROWS)
            b = None
            if any(layer.bias is not None for layer in self.layers):
                b = torch.cat([
                    layer.bias.detach() if layer.bias is not None else ws[0].new_zeros(layer.out_features)
                    for layer in self.layers
                ])
        # MKL's op reads its original weight's shape only (its fallback, for another row count than the one it
        # is told, never runs: it is told the input's own): a zero-stride stand-in, not a second copy of the weights
        shape = whole.new_empty(()).expand(whole.shape) if kind == "mkl" else None
        return src, w, b, kind, shape

    def __call__(self, x: torch.Tensor, post: tuple[str, str] | None = None) -> list[torch.Tensor] | torch.Tensor | None:
        """post: a oneDNN activation applied to the result in the same pass, e.g. ("gelu", "none"); on MKL's path
        None comes back for it, and the caller runs the plain layer (its packed product) and the activation."""
        w = self.layers[0].weight
        if not (
            _ONEDNN and fast_path_enabled and x.dim() >= 2 and x.dtype == w.dtype and _packs(x.dtype)
            and x.device.type == "cpu" and w.device.type == "cpu" and torch._C._get_mkldnn_enabled()
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
        ):
            return None
        rows = x.numel() // x.shape[-1]
        kind = _path(x.dtype, rows)
        if kind == "plain" or (kind == "mkl" and post is not None):
            return None
        src = self._sources()
        if src is None:
            return None
        cache = self._cache
        if cache is None or cache[3] != kind or not self._same(cache[0], src):
            cache = self._cache = self._pack(src, kind)
        flat = x.reshape(rows, x.shape[-1])
        if kind == "mkl":  # no kernel per row count to bound: no padding
            y = torch.ops.mkl._mkl_linear(flat, cache[1], cache[4], cache[2], rows)
        else:
            attr, algorithm = post or ("none", "")
            padded = padded_rows(rows) if bucketing_enabled else rows
            if padded != rows:  # one padded copy (F.pad), not zeros and a cat
                flat = F.pad(flat, (0, 0, 0, padded - rows))
            if kind == "measure":
                key = (flat.shape[1], sum(self.sizes), attr, algorithm, padded > 64)
                wins = _measured.get(key)
                if wins is None:
                    wins = _measured[key] = self._packed_is_faster(flat, cache, attr, algorithm)
                if not wins:
                    return None
            y = torch.ops.mkldnn._linear_pointwise(flat, cache[1], cache[2], attr, [], algorithm)[:rows]
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return y if len(self.layers) == 1 else y.split(self.sizes, dim=-1)

    def _packed_is_faster(self, flat: torch.Tensor, cache: tuple, attr: str, algorithm: str) -> bool:
        """Time this input both ways, interleaved, best of _REPEATS each: the packed product (with its post-op)
        against what the caller runs when this returns None (F.linear per layer, then the activation)."""
        act = {"gelu": lambda y: F.gelu(y, approximate=algorithm if algorithm == "tanh" else "none"),
               "relu": F.relu}.get(attr, lambda y: y)
        packed = lambda: torch.ops.mkldnn._linear_pointwise(flat, cache[1], cache[2], attr, [], algorithm)  # noqa: E731
        plain = lambda: [act(F.linear(flat, layer.weight, layer.bias)) for layer in self.layers]  # noqa: E731
        best = [float("inf"), float("inf")]
        with torch.no_grad():
            for i in range(2 * _REPEATS + 2):  # the first of each warms up (oneDNN compiles its kernel)
                t0 = time.perf_counter()
                (packed if i % 2 == 0 else plain)()
                if i >= 2:
                    best[i % 2] = min(best[i % 2], time.perf_counter() - t0)
        return best[0] < best[1]


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state_dict) with the packed fast path above."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.packed = PackedLinears((self,))

    def _apply(self, fn, recurse=True):
        self.packed.clear()  # .to(), .float(), .cuda(): the cache describes the old tensors
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.packed(x)
        return F.linear(x, self.weight, self.bias) if y is None else y
