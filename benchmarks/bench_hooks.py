"""What the hook API costs, on SmolLM2-135M, same run: `run` with no hook (the reference), `run_with_hooks` with
one no-op hook on every layer's hook_z, `run_with_cache` of the residual stream (every hook_resid_post), of
every head's output (every hook_z), and of every hook point (patterns and logits included), and `trace` keeping
nothing (what an analysis pays for the public entry instead of the module). The runs alternate, so each ratio
is the median of same-minute pairs. Markdown table of medians (ms) and ratios to `run`.

    python benchmarks/bench_hooks.py [--tokens 128,512] [--runs 7] [--threads 2] [--out docs/bench_hooks.md]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEXT = ("Attention lets every token look at the tokens before it and decide how much each one matters. " * 200)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="128,512")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    import attn_explorer as ax

    m = ax.load_model("smollm2-135m", device="cpu")
    L = m.info.num_layers
    noop = {f"blocks.{i}.attn.hook_z": (lambda z, name: None) for i in range(L)}
    cases = {
        "run (reference)": lambda n: m.run(TEXT, max_tokens=n, lazy=False),
        "run_with_hooks: a no-op on every hook_z": lambda n: m.run_with_hooks(TEXT, noop, max_tokens=n, lazy=False),
        "run_with_cache: every hook_resid_post": lambda n: m.run_with_cache(
            TEXT, names=lambda s: s.endswith("hook_resid_post"), max_tokens=n, lazy=False),
        "run_with_cache: every hook_z": lambda n: m.run_with_cache(
            TEXT, names=lambda s: s.endswith("hook_z"), max_tokens=n, lazy=False),
        "run_with_cache: every point": lambda n: m.run_with_cache(TEXT, max_tokens=n, lazy=False),
        "trace, nothing kept (no maps)": lambda n: m.trace(m.prepare(TEXT, max_tokens=n)),
    }
    rows = []
    for n in [int(t) for t in args.tokens.split(",")]:
        for fn in cases.values():  # warm-up
            fn(n)
        times = {k: [] for k in cases}
        for _ in range(args.runs):
            for k, fn in cases.items():
                t0 = time.perf_counter()
                fn(n)
                times[k].append((time.perf_counter() - t0) * 1000)
        ref = times["run (reference)"]
        for k, ts in times.items():
            ratio = statistics.median(t / r for t, r in zip(ts, ref))
            rows.append((n, k, statistics.median(ts), min(ts), max(ts), ratio))
            print(f"  n={n} {k}: {statistics.median(ts):.1f} ms ({ratio:.2f}x)", file=sys.stderr, flush=True)
    lines = [f"SmolLM2-135M, CPU, {args.threads} threads, {args.runs} alternating runs after a warm-up; ratio = median of "
             "same-round ratios to `run`.", "",
             "| n | call | median ms | min–max ms | × run |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {k} | {med:.1f} | {lo:.1f}–{hi:.1f} | {ratio:.2f} |" for n, k, med, lo, hi, ratio in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
