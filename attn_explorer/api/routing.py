"""An MoE model's routing as data: the hooks a run records it with, and `RunResult.routing` made from them.

Every run of a model with MoE layers (ModelInfo.moe_layers) keeps, through caching hooks on
blocks.{i}.mlp.hook_expert_indices and .hook_expert_weights, which k experts each token went to and with
what weights; nothing runs twice. A run that reuses a prefix (api.prefix) splices the kept run's first p
tokens' routing before the new tokens', as it splices their maps.
"""
from __future__ import annotations

import numpy as np

from attn_explorer.api.hooks import caching_hook
from attn_explorer.api.result import Routing
from attn_explorer.core.hooks import MOE_POINTS


def names(info) -> list[str]:
    """The routing hook points of a model (ModelInfo): none for a dense one."""
    return [f"blocks.{i}.{p}" for i, moe in enumerate(info.moe_layers) if moe for p in MOE_POINTS]


class Recorder:
    """Caching hooks (`table`, {} for a dense model) that keep one forward's routing in `store`."""

    def __init__(self, info):
        self.info = info
        self.store: dict = {}
        self.table = {n: caching_hook(self.store) for n in names(info)}

    def result(self) -> Routing | None:
        return routing_of(self.info, self.store)


def routing_of(info, store) -> Routing | None:
    """The first input's routing (batch row 0) from a store of the routing hooks' tensors; None for a dense
    model or a forward that did not record it."""
    if not any(info.moe_layers):
        return None
    experts, weights = [], []
    for i, moe in enumerate(info.moe_layers):
        idx, w = store.get(f"blocks.{i}.{MOE_POINTS[0]}"), store.get(f"blocks.{i}.{MOE_POINTS[1]}")
        if moe and (idx is None or w is None):
            return None
        experts.append(None if not moe else np.ascontiguousarray(idx[0].cpu().numpy(), dtype=np.int64))
        weights.append(None if not moe else np.ascontiguousarray(w[0].float().cpu().numpy(), dtype=np.float32))
    return Routing(info.num_experts, tuple(experts), tuple(weights))


def spliced(old: Routing | None, new: Routing | None, p: int) -> Routing | None:
    """A reused prefix's routing: the kept run's first p tokens, then the new tokens' (each token's routing
    depends only on the tokens up to it, in a causal model)."""
    if old is None or new is None or p == 0:
        return new
    cat = [None if a is None else np.concatenate([a[:p], b]) for a, b in zip(old.experts, new.experts)]
    cat_w = [None if a is None else np.concatenate([a[:p], b]) for a, b in zip(old.weights, new.weights)]
    return Routing(new.num_experts, tuple(cat), tuple(cat_w))
