"""The approximations measured on a model's own q, k and v, next to random ones of the same shape.

Random N(0, 1) queries spread their attention over every key, so a local window misses most of
it; a trained model's heads mostly look nearby, so window attention is far closer on its real
q, k, v. `compare_on_qkv` measures each variant's relative error against exact attention (and
its time) on the tensors it is given, and on random tensors of the same shape, so both numbers
sit side by side. The caller gets q, k, v from the model (api.probe.layer_qkv, run by the session
or the CLI): this floor does not import api/.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

from attn_explorer.cost.config import SweepConfig
from attn_explorer.cost.measure import errors, timed_call
from attn_explorer.cost.variants import NAMES, get


@dataclass
class QKVComparison:
    """One variant on the model's q, k, v and on random ones. Plain data."""

    impl: str
    rel_error: float | None  # ‖out − exact‖ / ‖exact‖ on the model's q, k, v (None for the reference)
    random_rel_error: float | None  # the same on random N(0, 1) q, k, v of the same shape
    ms: float  # median time of the timed calls on the model's q, k, v
    ms_min: float
    ms_max: float

    def to_dict(self) -> dict:
        return asdict(self)


def window_for(n: int, window: int) -> int:
    """The window used on an input of n tokens: the given one when it is shorter than the input;
    otherwise a quarter of the input, since a window covering every token would be exact attention."""
    return window if window < n else max(1, n // 4)


def compare_on_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impls: Sequence[str] = NAMES,
                   window: int = 128, causal: bool = False, repeats: int = 3, seed: int = 0) -> list[QKVComparison]:
    """q, k, v shaped (H, N, d_k) from one layer. Errors are against naive (exact) attention."""
    if q.dim() != 3 or q.shape != k.shape or k.shape[:2] != v.shape[:2]:
        raise ValueError(f"q, k, v must be shaped (H, N, d_k) alike, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    for impl in impls:
        get(impl)
    H, N, d_k = q.shape
    cfg = SweepConfig(ns=[N], impls=list(impls), heads=H, d_k=d_k, causal=causal, window=window_for(N, window))
    real = [t.detach().float().unsqueeze(0).contiguous() for t in (q, k, v)]  # (1, H, N, d_k)
    g = torch.Generator(device=q.device).manual_seed(seed)
    rand = [torch.randn(r.shape, generator=g, device=q.device) for r in real]
    device = q.device

    def call(impl: str, qkv: list[torch.Tensor]):
        variant = get(impl)
        return lambda: variant.kernel(*qkv, causal=causal, **variant.kwargs(cfg))

    with torch.no_grad():
        exact = [call("naive", qkv)() for qkv in (real, rand)]
        rows = {}
        for impl in impls:
            outs = [call(impl, qkv)() for qkv in (real, rand)]  # also the warm-up
            errs = [None, None] if impl == "naive" else [errors(o, e)[0] for o, e in zip(outs, exact)]
            rows[impl] = (errs, [])
        for r in range(repeats):  # interleaved, as in the sweep
            names = list(impls)[r % len(impls):] + list(impls)[:r % len(impls)]
            for impl in names:
                rows[impl][1].append(timed_call(call(impl, real), device))
    return [QKVComparison(impl=impl, rel_error=errs[0], random_rel_error=errs[1], ms=statistics.median(runs),
                          ms_min=min(runs), ms_max=max(runs)) for impl, (errs, runs) in rows.items()]
