"""Build a lesson's seeded model so that its weights are really its seed's, even while a model loads.

A load (`hub.built.skip_init`) swaps `torch.nn.init`'s functions for no-ops, process-wide, while it
builds its module: a lesson model built in another thread at that moment would keep torch.empty's
garbage as weights (the order lesson showed "nan"). A seeded build is the same every time, so two
builds that agree, made while init is genuine, are the seed's weights.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

import torch

M = TypeVar("M", bound=torch.nn.Module)
_NAMES = ("uniform_", "normal_", "kaiming_uniform_", "trunc_normal_", "ones_", "zeros_")
_GENUINE = {n: getattr(torch.nn.init, n) for n in _NAMES}  # this module is imported before any load runs


def _init_is_genuine() -> bool:
    return all(getattr(torch.nn.init, n) is f for n, f in _GENUINE.items())


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def build_seeded(make: Callable[[], M], tries: int = 500) -> M:
    """make() -> a module whose weights depend only on its seed; built until two builds agree."""
    for _ in range(tries):
        if _init_is_genuine():
            first = make()
            if _init_is_genuine() and _same(first, make()):
                return first
        time.sleep(0.01)  # a load is building its module: it takes a moment
    raise RuntimeError("could not build the lesson's seeded model while models were loading")
