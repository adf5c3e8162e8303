"""Small NumPy measures the views print next to the heatmaps (entropy, peak weight, counts), and durations.

Plain NumPy on arrays the GUI already holds; no model code. Entropy and "hide special tokens" are
attn_explorer.maths' (the one copy).
"""
from __future__ import annotations

import numpy as np

from attn_explorer.maths import entropy_bits


def head_entropy_and_peak(layer_att: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For one layer's (H, N, N) attention: mean row entropy in bits and mean max weight, per head."""
    a = np.asarray(layer_att, dtype=np.float32)
    return entropy_bits(a).mean(axis=-1), a.max(axis=-1).mean(axis=-1)


def human_count(x: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (SI prefixes), for FLOPs."""
    for div, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g} {p}{unit}"
    return f"{x:.3g} {unit}".rstrip()


def human_duration(ms: float) -> str:
    """A time as a person reads it: "12.3 ms" under a second, "4.2 s" under a minute, "4 min 11 s" under
    an hour, then "3 h 2 min" (a forward pass over a long input takes minutes)."""
    ms = float(ms)
    if ms < 1000:
        return f"{ms:.1f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    s = int(round(ms / 1000))
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def work_line(work: dict[str, float]) -> str:
    """What ran beside a timing (session.runner.Runner.work: job name -> seconds), the longest first:
    "cost-sweep 44.7 ms, model-run 2.0 s"."""
    return ", ".join(f"{k} {human_duration(sec * 1000)}" for k, sec in sorted(work.items(), key=lambda kv: -kv[1]))
