"""What a cost sweep measures: one small dataclass shared by the CLI, the session and the measuring loop.

No torch here, so the GUI can build a config and the guard can predict memory before torch loads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from attn_explorer.cost.memory import ELEM_BYTES
from attn_explorer.cost.variants import NAMES, get

DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass
class SweepConfig:
    """What to measure. Every field has a default except the sizes."""

    ns: list[int]  # sequence lengths, measured in this order
    impls: list[str] = field(default_factory=lambda: list(NAMES))  # variant names, see variants.NAMES
    heads: int = 12  # H
    d_k: int = 64  # per-head width of q, k and v
    batch: int = 1  # B
    dtype: str = "float32"  # float32, bfloat16 or float16 (the last two on a GPU)
    device: str = "cpu"  # a torch device string
    causal: bool = False  # decoder-style masking for every variant
    repeats: int = 3  # timed runs per point, interleaved across the variants; the median is reported
    time_budget_s: float | None = None  # stop timing a point after about this many seconds (>= 1 run)
    window: int = 128  # window attention's window (tokens)
    q_block: int | None = None  # chunked attention's query tile; None = core.efficient.auto_q_block(n)
    k_block: int = 256  # chunked attention's key tile
    budget_bytes: int | None = None  # memory guard; None = memory.default_budget(device)
    seed: int = 0  # q, k, v are drawn from N(0, 1) with this seed, per n

    def validate(self) -> None:
        """Raise ValueError, with one line saying what is wrong."""
        if not self.ns:
            raise ValueError("no sequence lengths to measure")
        for n in self.ns:
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"sequence length must be a positive integer, got {n!r}")
        if not self.impls:
            raise ValueError("no variants to measure")
        for impl in self.impls:
            get(impl)
        for name in ("heads", "d_k", "batch", "repeats", "window", "q_block", "k_block"):
            value = getattr(self, name)
            if name == "q_block" and value is None:
                continue
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPE_NAMES or self.dtype not in ELEM_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}: use float32, bfloat16 or float16")
        if self.budget_bytes is not None and not (self.budget_bytes > 0 and math.isfinite(self.budget_bytes)):
            raise ValueError(f"memory budget must be a positive number of bytes, got {self.budget_bytes!r}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"time budget must be positive, got {self.time_budget_s!r}")
