"""The logit lens, direct logit attribution, the contribution graph and the why-matrix on SmolLM2 at 32 tokens,
each against one forward pass in the same run (medians). One markdown table.

    python benchmarks/bench_lens.py [--model smollm2-135m] [--tokens 32] [--runs 7] [--threads 2]

"one forward pass" runs the module on the prepared input with no maps returned (what every analysis here needs
at least once); "forward with maps" is what Model.run pays. Each analysis is timed whole: tokenising, its own
forward pass with captures, and its arithmetic. The contribution graph's target is <= 3x one forward pass per
output token (one graph serves every output token: tracing it again is NumPy, timed as "trace"). Only the
ratios carry across machines; the rows are timed round-robin, so a busy machine slows them alike. The plain
forward pass computes no logits at all: the lens computes L + 1 unembeddings (V × D each), which is most of its
cost on a 49k-token vocabulary.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis.flow import contribution_graph, trace  # noqa: E402
from attn_explorer.analysis.lens import logit_attribution, logit_lens  # noqa: E402
from attn_explorer.analysis.why import why_matrix  # noqa: E402

TEXT = ("When Mary and John went to the store, John gave a drink to Mary. Then they walked home along the river, "
        "talking about the weather and the books they had read that week, and")


def timed_together(fns: list, runs: int) -> list[float]:
    """Median seconds of each function, measured round-robin (one call of each per round, after one warm-up
    round), so a busy machine slows every row alike and the ratios stay fair."""
    for fn in fns:
        fn()  # warm-up: kernels chosen, caches filled
    times = [[] for _ in fns]
    for _ in range(runs):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = ax.load_model(a.model, device="cpu")
    kw = {"max_tokens": a.tokens}
    inputs = m.prepare(TEXT, max_tokens=a.tokens).inputs
    n = inputs["input_ids"].shape[1]
    L, H = m.info.num_layers, m.info.num_heads
    graph = contribution_graph(m, TEXT, kw)
    rows = [
        ("one forward pass (no maps)", lambda: m._forward(inputs, output_attentions=False)),
        ("forward with maps (Model.run)", lambda: m.run(TEXT, max_tokens=a.tokens)),
        ("logit lens (top-5, every layer × position)", lambda: logit_lens(m, TEXT, kw, k=5)),
        ("direct logit attribution (one target)", lambda: logit_attribution(m, TEXT, kw)),
        ("contribution graph (every edge's share)", lambda: contribution_graph(m, TEXT, kw)),
        ("trace at threshold 0.04 (NumPy, GUI thread)", lambda: trace(graph, -1, 0.04)),
        (f"why-matrix (L{L - 1} H0, last query)", lambda: why_matrix(m, TEXT, kw, L - 1, 0, n - 1, 0)),
    ]
    times = list(zip([name for name, _ in rows], timed_together([fn for _, fn in rows], a.runs)))
    base = times[0][1]
    print(f"{a.model}, {n} tokens, {L} layers × {H} heads, {a.threads} threads, median of {a.runs} runs\n")
    print("| what | median ms | × one forward pass |")
    print("|---|---:|---:|")
    for name, t in times:
        print(f"| {name} | {t * 1000:.1f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
