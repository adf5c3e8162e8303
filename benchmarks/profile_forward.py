"""Where a long forward's time goes: torch.profiler's top ops and their shares, lazy and dense forwards.

Gemma 3 270M (the GGUF built-in "gemma3-270m") and SmolLM2 135M ("smollm2-135m"), random token ids, at
1,024 and 4,096 tokens (16,384 too with --long), float32 and bfloat16. "lazy" keeps q, k and lse
(core.lazy, what a long run does); "dense" is the plain forward that returns no maps (the fused kernel).
One warm-up forward, then one profiled forward per case; each op's share is its self CPU time over the
forward's total self CPU time. One markdown table per case.

    python benchmarks/profile_forward.py [--models gemma3-270m,smollm2-135m] [--sizes 1024,4096] [--long]
        [--dtypes float32,bfloat16] [--modes lazy,dense] [--top 10] [--out notes.md]

A shared machine's load changes the times, less so the shares: compare shares, and times only within a run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def profile_case(m, n: int, mode: str, top: int) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from attn_explorer.core.hooks import Hooks

    vocab = m.module.embed_tokens.num_embeddings
    ids = torch.randint(10, min(vocab, 5000), (1, n), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids}

    def forward():
        hooks = Hooks(keep=True) if mode == "lazy" else None
        m._forward(inputs, hooks=hooks, output_attentions=False)

    forward()  # warm-up: kernels, RoPE tables, packed weights
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward()
    wall = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: -e.self_cpu_time_total)
    rows = [f"wall {wall:.2f} s (profiled), self CPU {total / 1e6:.2f} s", "",
            "| op | share | self s | calls |", "|---|---:|---:|---:|"]
    for e in events[:top]:
        rows.append(f"| `{e.key}` | {100 * e.self_cpu_time_total / total:.1f} % | "
                    f"{e.self_cpu_time_total / 1e6:.2f} | {e.count} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gemma3-270m,smollm2-135m")
    p.add_argument("--sizes", default="1024,4096")
    p.add_argument("--long", action="store_true", help="also 16,384 tokens")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--modes", default="lazy,dense")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--out", default=None, help="also append the tables to this markdown file")
    args = p.parse_args(argv)
    import torch

    import attn_explorer as ax

    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")] + ([16384] if args.long else [])
    cap = torch.backends.cpu.get_cpu_capability()
    parts = [f"CPU capability {cap}, {args.threads} threads, torch {torch.__version__}"]
    for name in args.models.split(","):
        for dtype in args.dtypes.split(","):
            m = ax.load_model(name, device="cpu", dtype=dtype)
            for n in sizes:
                for mode in args.modes.split(","):
                    title = f"### {name}, {dtype}, n = {n:,}, {mode}"
                    table = profile_case(m, n, mode, args.top)
                    parts.append(f"{title}\n\n{table}")
                    print(parts[-1] + "\n", flush=True)
            del m
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
