"""How much faster this machine multiplies a model's own shapes in bfloat16 than in float32 (issue 24 B: the offer).

`model_shapes(module, heads)` reads a module's linear layers (their (in, out) widths, each counted as often as it
occurs) and its attention heads' width; `measure_rates(shapes, heads, head_dim)` times those products on `ROWS`
rows, and a causal attention kernel on `ATTN_TOKENS` tokens, in float32 and in bfloat16, interleaved, the best of a
few each, and returns seconds per token (products) and per head and query-key pair (attention) for both. Measured
on this machine once per process (cached by shapes): 0.7 s for Gemma 3 270M's shapes on 2 cores under a load of 13
(no kept round starts after BUDGET_S). The session turns these rates and the float32 run's measured forward into an
estimate (session.bf16_offer); nothing here assumes a speed-up.
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core import bf16_attention

ROWS = 256  # rows of each timed product (the products of a long input are the same shapes with more rows)
ATTN_TOKENS = 512  # tokens of the timed causal attention
REPEATS = 2  # best of, per dtype, interleaved, after one warm-up round
BUDGET_S = 1.0  # no kept round starts after this much time (the first kept one always runs)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def model_shapes(module: nn.Module, heads: int) -> tuple[tuple[tuple[int, int], ...], int]:
    """((in, out) of every linear layer, repeats kept, sorted), and the heads' width: the query layer's outputs over
    `heads` where one is named so, else the model width over `heads`. A linear to 16× the model's width or more (an
    untied language-model head) is left out: a run that returns maps does not spend its time there."""
    shapes, head_dim, widest_in = [], 0, 1
    for name, mod in module.named_modules():
        if isinstance(mod, nn.Linear):
            shapes.append((int(mod.in_features), int(mod.out_features)))
            widest_in = max(widest_in, int(mod.in_features))
            leaf = name.rsplit(".", 1)[-1]
            if not head_dim and leaf in ("query", "q_proj", "q") and heads and mod.out_features % heads == 0:
                head_dim = int(mod.out_features) // heads
    shapes = [s for s in shapes if s[1] < 16 * widest_in]
    if not head_dim:
        widths = [i for i, _ in shapes]
        head_dim = max(1, (min(widths) if widths else 64) // max(1, heads))
    return tuple(sorted(shapes)), head_dim


def _timed(fn: Callable[[], object], clock: Callable[[], float]) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def measure_rates(shapes: tuple[tuple[int, int], ...], heads: int, head_dim: int,
                  clock: Callable[[], float] = time.perf_counter) -> dict:
    """{"float32": {"linear_s_per_token", "attn_s_per_pair"}, "bfloat16": {...}, "seconds": time spent}: the model's
    products timed on ROWS rows (each distinct shape once, weighted by how often it occurs) and a causal attention
    kernel (heads × ATTN_TOKENS × head_dim), per dtype, the best of REPEATS, float32 and bfloat16 interleaved.
    Cached per process for the same arguments (with the default clock)."""
    if clock is time.perf_counter:
        return _cached(tuple(shapes), int(heads), int(head_dim))
    return _measure(tuple(shapes), int(heads), int(head_dim), clock)


@functools.lru_cache(maxsize=16)
def _cached(shapes: tuple, heads: int, head_dim: int) -> dict:
    return _measure(shapes, heads, head_dim, time.perf_counter)


def _measure(shapes: tuple, heads: int, head_dim: int, clock: Callable[[], float]) -> dict:
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    counts: dict[tuple[int, int], int] = {}
    for s in shapes:
        counts[s] = counts.get(s, 0) + 1
    heads, head_dim = max(1, heads), max(1, head_dim)
    out = {}
    with torch.inference_mode():
        x32 = {i: torch.randn(ROWS, i, generator=gen) for i, _ in counts}
        w32 = {s: torch.randn(s[1], s[0], generator=gen) / s[0] ** 0.5 for s in counts}
        q32 = torch.randn(1, heads, ATTN_TOKENS, head_dim, generator=gen)
        data = {name: (x32 if dt is torch.float32 else {i: x.to(dt) for i, x in x32.items()},
                       w32 if dt is torch.float32 else {s: w.to(dt) for s, w in w32.items()}, q32.to(dt))
                for name, dt in DTYPES.items()}
        best = {name: {"linear": {s: float("inf") for s in counts}, "attn": float("inf")} for name in DTYPES}
        for round_ in range(REPEATS + 1):  # round 0 warms the kernels up and is not kept
            if round_ > 1 and time.perf_counter() - started > BUDGET_S:
                break  # a busy machine: one kept round is all it gets
            for name, (xs, ws, q) in data.items():
                b = best[name]
                for s in counts:
                    t = _timed(lambda: F.linear(xs[s[0]], ws[s]), clock)
                    if round_:
                        b["linear"][s] = min(b["linear"][s], t)
                t = _timed(lambda: _causal(q), clock)
                if round_:
                    b["attn"] = min(b["attn"], t)
    pairs = heads * ATTN_TOKENS * (ATTN_TOKENS + 1) / 2
    for name, b in best.items():
        linear = sum(b["linear"][s] * c for s, c in counts.items())
        out[name] = {"linear_s_per_token": linear / ROWS, "attn_s_per_pair": b["attn"] / pairs}
    out["seconds"] = time.perf_counter() - started
    return out


def _causal(q: torch.Tensor) -> torch.Tensor:
    """A global causal attention as the lazy forward runs it: core.bf16_attention's products where that kernel
    pays for such a layer (bf16_attention.pays), else torch's kernel, in either dtype."""
    if q.dtype == torch.bfloat16 and bf16_attention.pays(None, True):
        return bf16_attention.attention(q, q, q, q.shape[-1] ** -0.5, True, None)[0]
    return F.scaled_dot_product_attention(q, q, q, is_causal=True)
