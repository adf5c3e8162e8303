"""Memory for the cost lab: measure a call's peak, predict it before running, and set a budget.

How peak memory is measured
---------------------------
- CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus what was
  allocated before the call. That is the caching allocator's own count of live tensor bytes.
- CPU: torch has no allocation counter for the CPU, so the call runs under
  ``torch.profiler.profile(profile_memory=True)``. Every allocation and free that goes through
  torch's CPU allocator, including the scratch buffers inside kernels such as SDPA's, is
  reported to the profiler as a signed byte count. The running sum of those events, in time
  order, is the bytes held by tensors made during the call; its maximum is the peak. Tensors
  that existed before the call (the inputs) are not in it; the output is.
  This is neither process RSS nor an estimate: it is the allocator's own ledger. The profiler
  slows the call down, so the profiled call is the warm-up and is never timed.
- Other devices: not measured (None).

Before a run the guard compares each variant's predicted bytes (``variants.point_bytes``, a
deliberately generous count of every tensor the variant builds) with the budget set here, and
skips runs that would not fit.

torch is imported inside the functions that need it, so the GUI can budget (to size its slider)
before anything has loaded torch.
"""
from __future__ import annotations

import os
from typing import Any, Callable

# Kineto prints two lines to stderr each time a profiler starts and stops; one measurement per
# point would bury the CLI's table in them. Level 9 silences it (only if the user set nothing).
os.environ.setdefault("KINETO_LOG_LEVEL", "9")


def human_bytes(b: float | None) -> str:
    """12.3 GB, 45.6 MB, 7.8 kB: decimal units, three significant figures."""
    if b is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= size:
            return f"{b / size:.3g} {unit}"
    return f"{int(b)} B"


ELEM_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float64": 8}


def elem_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given as a name ("float32") or a torch.dtype."""
    if isinstance(dtype, str):
        return ELEM_BYTES[dtype.lower()]
    return dtype.itemsize


def device_type(device: Any) -> str:
    """'cpu', 'cuda', ... from a torch.device or a string such as 'cuda:1'."""
    return getattr(device, "type", None) or str(device).split(":")[0]


# --- measuring ------------------------------------------------------------------------------


def _cpu_peak_from_profile(prof: Any) -> int:
    """Maximum of the running sum of CPU allocator events recorded by the profiler."""
    from torch.autograd import DeviceType

    results = getattr(prof.profiler, "kineto_results", None)
    if results is not None:
        events = [(e.start_ns(), e.nbytes()) for e in results.events()
                  if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    else:  # older torch: the FunctionEvent list carries the same events
        events = [(e.time_range.start, e.cpu_memory_usage) for e in prof.events() if e.name == "[memory]"]
    events.sort(key=lambda t: t[0])  # stable: same-time events keep their recorded order
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def run_measuring_memory(fn: Callable[[], Any], device: Any) -> tuple[Any, int | None, str | None]:
    """Call fn() once and return (its result, peak bytes allocated during it, method name).

    The method is "cuda-allocator", "cpu-profiler" or None where the device has no counter.
    """
    import torch

    if device_type(device) == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        return out, torch.cuda.max_memory_allocated(device) - base, "cuda-allocator"
    if device_type(device) == "cpu":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn()
        return out, _cpu_peak_from_profile(prof), "cpu-profiler"
    return fn(), None, None


# --- sizes ---------------------------------------------------------------------------------


def matrix_bytes(n: int, heads: int, batch: int = 1, elem: int = 4) -> int:
    """Bytes of the exact (B, H, n, n) attention matrix: what the quadratic cost is about."""
    return batch * heads * n * n * elem


# --- budgeting ------------------------------------------------------------------------------


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
