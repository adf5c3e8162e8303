"""Small NumPy measures the views print next to the heatmaps (entropy, peak weight, counts).

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

