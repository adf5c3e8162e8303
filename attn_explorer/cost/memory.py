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

# The budget is shared with the model API's guard (one rule for "would this fit?"): see attn_explorer/budget.py.
from attn_explorer.budget import (BUDGET_SHARE, FALLBACK_BUDGET, available_bytes, default_budget,  # noqa: E402,F401
                                  device_type, human_bytes, matrix_bytes)


ELEM_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float64": 8}


def elem_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given as a name ("float32") or a torch.dtype."""
    if isinstance(dtype, str):
        return ELEM_BYTES[dtype.lower()]
    return dtype.itemsize


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
