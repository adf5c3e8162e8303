"""How much memory a job may use, and what attention's n×n maps need: one rule for every front end.

The cost lab's guard (`cost.variants.point_bytes` against `default_budget`) and the model API's guard
(`Model.run` refuses an input whose attention maps would not fit) both read this module, so a size
the Cost page calls too big is too big everywhere. No torch at import: the GUI budgets before torch
has loaded.
"""
from __future__ import annotations

from typing import Any


def human_bytes(b: float | None) -> str:
    """12.3 GB, 45.6 MB, 7.8 kB: decimal units, three significant figures."""
    if b is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= size:
            return f"{b / size:.3g} {unit}"
    return f"{int(b)} B"


def device_type(device: Any) -> str:
    """'cpu', 'cuda', ... from a torch.device or a string such as 'cuda:1'."""
    return getattr(device, "type", None) or str(device).split(":")[0]


def matrix_bytes(n: int, heads: int, batch: int = 1, elem: int = 4) -> int:
    """Bytes of the exact (B, H, n, n) attention matrix: what the quadratic cost is about."""
    return batch * heads * n * n * elem


def available_bytes(device: Any = "cpu") -> int | None:
    """Memory free for new tensors now: MemAvailable (Linux) or psutil on CPU, free memory on CUDA."""
    kind = device_type(device)
    if kind == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    if kind != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil  # optional: only where /proc/meminfo is missing (macOS, Windows)

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


# Share of free memory a sweep may use: the machine keeps running other things, and on CUDA
# the allocator needs slack for fragmentation.
BUDGET_SHARE = {"cpu": 0.5, "cuda": 0.8}
FALLBACK_BUDGET = 2 * 2**30  # when the free memory cannot be read


def default_budget(device: Any = "cpu") -> int:
    """A safe budget in bytes: half of MemAvailable on CPU, 80 % of free memory on CUDA."""
    free = available_bytes(device)
    if free is None:
        return FALLBACK_BUDGET
    return int(free * BUDGET_SHARE.get(device_type(device), 0.5))


def attention_maps_bytes(n: int, layers: int, heads: int, batch: int = 1, elem: int = 4) -> int:
    """Bytes of every layer's (B, H, n, n) attention, as a run that returns all the maps holds them."""
    return layers * matrix_bytes(n, heads, batch, elem)
