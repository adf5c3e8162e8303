"""Torch's threads for the session's jobs (each model job calls configure_torch first)."""
from __future__ import annotations

import os

# torch's intra-op threads for every model job: every core but one, which stays with the GUI thread.
# Measured on a 2-core machine (benchmarks/bench_gui.py, docs/bench_gui.md): idle, 2 threads were
# 1.4-1.9x faster than 1; with another program holding one core they were 1.5-2.2x slower, and the
# GUI thread then had no core for painting. One spare core keeps typing fluid under load.
TORCH_THREADS = max(1, (os.cpu_count() or 2) - 1)


def configure_torch(threads: int = TORCH_THREADS) -> None:
    """Set torch's intra-op threads. Every model job calls it first: the jobs run on whichever pool
    thread is free, and OpenMP keeps its thread count per calling thread. Here, not at start-up,
    because importing torch in the GUI thread would delay the window."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
