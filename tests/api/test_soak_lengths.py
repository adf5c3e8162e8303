"""Soak: 10,000 runs of MiniLM at seeded random lengths up to 512 tokens keep the process's memory bounded.

oneDNN keeps one compiled kernel per input shape (~0.5 MB each, up to 1,024). Before core.linear padded
the rows to buckets, every new length added four kernels and this soak grew the process by hundreds of MB.
The warm-up runs every multiple of 8 up to 512 tokens once (every bucket, and the largest maps the
allocator will hold), then 200 runs of random length (the allocator's heap settles in the first few
hundred; ~170 lengths in all, far fewer than the ~500 after it, so the old growth still shows); over the
10,000 runs after it VmRSS may grow by at most 50 MB, with the CPU fast path on (the default; running
F.linear too would double the minutes).

Lengths are log-uniform from MiniLM's shortest input ([CLS] word [SEP], 3 tokens) to 512: as many texts
of 4–8 tokens as of 256–512, as live typing sends them, and ~500 different lengths in all. Uniform
lengths would take about three times the minutes (the long runs dominate: mean n² 87,000 against 25,000).
"""
from __future__ import annotations

import gc
import math
import random
import time

import pytest

import attn_explorer as ax
from attn_explorer.core import heap, linear

RUNS = 10_000
WARM_UP_RANDOM = 200
LONGEST = 512
MAX_GROWTH_MB = 50
WORDS = ("the animal did not cross street because it was too tired a quick brown fox jumps over lazy dog "
         "attention lets every token look at others in sentence").split()


def vmrss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.fixture(scope="module")
def minilm():
    return ax.load_model("minilm", device="cpu")


def soak(model, runs: int = RUNS, seed: int = 0) -> tuple[float, list[int]]:
    """The warm-up, then `runs` texts of random words, each cut to a random length; returns the VmRSS
    growth in MB over those runs, and the lengths run."""
    rng = random.Random(seed)
    shortest = model.info.min_tokens

    def run(n: int) -> None:
        text = " ".join(rng.choice(WORDS) for _ in range(n))  # each word is one word piece: >= n tokens
        r = model.run(text, max_tokens=n)
        assert r.num_tokens == n and r.attentions.shape[-1] == n

    def length() -> int:  # log-uniform from the shortest input to LONGEST
        return round(math.exp(rng.uniform(math.log(shortest), math.log(LONGEST))))

    for n in list(range(8, LONGEST + 1, 8)) + [length() for _ in range(WARM_UP_RANDOM)]:
        run(n)
    gc.collect()
    base = vmrss_mb()
    lengths = [length() for _ in range(runs)]
    for n in lengths:
        run(n)
    gc.collect()
    return vmrss_mb() - base, lengths


@pytest.mark.slow
def test_10000_runs_of_varied_length_keep_memory_bounded(minilm, monkeypatch):
    monkeypatch.setattr(linear, "fast_path_enabled", True)
    monkeypatch.setattr(linear, "path_choice", "packed")  # the packed path's kernel cache is what this soaks
    with heap.large_blocks_kept():  # what a long forward earlier in the process leaves behind (as in CI's whole
        pass  # suite): its 1 GiB malloc thresholds, kept for the process's life, had fragmented this heap by 275 MB
    t0 = time.perf_counter()
    grown, lengths = soak(minilm)
    seconds = time.perf_counter() - t0
    assert min(lengths) <= 4 and max(lengths) >= 500 and len(set(lengths)) > 400  # the lengths really varied
    print(f"\n{len(lengths):,} runs on the fast path: VmRSS grew {grown:.1f} MB after the warm-up; {seconds:.0f} s")
    assert grown <= MAX_GROWTH_MB, f"VmRSS grew {grown:.1f} MB over {RUNS:,} runs of varied length"
