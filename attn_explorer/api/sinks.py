"""Learned attention sinks (gpt-oss) as users see them: each query row's share given to its head's sink.

A model with sinks (core.sinks) gives every row of every head's map a sink column that the N × N maps do
not hold: transformers returns the maps over the real keys, each row summing to 1 - the sink's share, and
so does `RunResult.attentions`. `RunResult.sinks` (L, H, N) float32 carries the share beside them, from
the same forward: 1 - each row's sum for a dense run, exp(sink - lse) for a lazy one (its kept lse
includes the sink). None for a model without sinks.
"""
from __future__ import annotations

import numpy as np
import torch


def model_has_sinks(module: torch.nn.Module) -> bool:
    """Whether the module's attention layers have learned sinks (gpt-oss)."""
    layers = getattr(getattr(module, "blocks", None), "layers", None) or ()
    return any(getattr(getattr(block, "attn", None), "sinks", None) is not None for block in layers)


def shares(module: torch.nn.Module, attentions, store=None) -> np.ndarray | None:
    """(L, H, N) float32: each query row's sink share, or None for a model without sinks. attentions: the
    run's dense maps (L, H, N, M) float32 NumPy; store: a lazy run's api.lazy.LazyAttention instead."""
    if not model_has_sinks(module):
        return None
    if store is not None:
        rows = []
        with torch.inference_mode():
            for layer in store.layers:
                s = layer.options.sinks
                lse = layer.lse[0].float()  # (H, N), batch row 0, the sink included
                rows.append(torch.exp(s.float().to(lse.device)[:, None] - lse).cpu().numpy())
        return np.ascontiguousarray(np.stack(rows), dtype=np.float32)
    row_sums = np.asarray(attentions).sum(axis=-1, dtype=np.float64)
    return np.ascontiguousarray(np.clip(1.0 - row_sums, 0.0, 1.0), dtype=np.float32)


def head_means(sinks: np.ndarray) -> np.ndarray:
    """(L, H) float32: what each head gives its sink, averaged over the query rows."""
    return np.asarray(sinks, dtype=np.float32).mean(axis=-1)
