"""The head atlas (issue 27) against the forward passes alone, on the bundled corpus.

One child process per corpus size (so each size's peak RSS is its own), on SmolLM2-135M (the built-in
"smollm2-135m"), every head (30 layers x 9). For N tokens of the bundled corpus (ten Shakespeare plays,
resources/corpus), cut into the atlas's segments (--context tokens each):

- forward: the same segments, each one plain forward pass of the same model (no maps, no hooks): the floor;
- atlas: build_atlas over the same N tokens (segmenting, lazy forward, every metric, the heaps);
- the ratio atlas / forward (target <= 1.5x); the forward runs before and after the atlas and the mean of the two
  is the floor, so a shared machine's load falls on both; beside wall time, the process's CPU time
  (time.process_time), which a loaded machine disturbs less (use --threads 1 there);
- peak RSS of the child (target <= 2 GB), which holds the model, both runs and the atlas: after the first
  forward run (the model and one forward) and at the end, so what the atlas adds is the difference.

    python benchmarks/bench_atlas.py --tokens 50000,200000 [--context 1024] [--threads 1]
    python benchmarks/bench_atlas.py --tokens 50000 --tokens 200000      # the same
    python benchmarks/bench_atlas.py --quick       # 4,000 tokens: a check that it runs, in a minute or two

On a shared machine, read the CPU columns at --threads 1 (time.process_time, same run) and give the load.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _segments(model, n_tokens: int, context: int) -> list[str]:
    """The texts of the segments the atlas reads for the first n_tokens of the bundled corpus."""
    from attn_explorer.analysis.atlas_build import segments
    from attn_explorer.analysis.atlas_build import corpus_files, read_documents as documents

    out, done = [], 0
    for _, text in documents(corpus_files([], []), per_line=False):
        for seg, n in segments(model, text, context):
            if done >= n_tokens:
                return out
            out.append(seg)
            done += n
    return out


def child(args) -> dict:
    import torch

    import attn_explorer as ax
    from attn_explorer.analysis.atlas_build import build_atlas
    from attn_explorer.analysis.atlas_build import corpus_files, read_documents as documents

    torch.set_num_threads(args.threads)
    model = ax.load_model(args.model, device="cpu")
    n = args.child
    segs = _segments(model, n, args.context)

    def forward() -> tuple[float, int, float]:
        t0, c0, tokens = time.perf_counter(), time.process_time(), 0
        for s in segs:
            prep = model.prepare(s, max_tokens=min(args.context, max(1, n - tokens)))
            model.trace(prep)
            tokens += len(prep.tokens)
            if tokens >= n:
                break
        return time.perf_counter() - t0, tokens, time.process_time() - c0

    forward_first, tokens, cpu_first = forward()
    rss_forward = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0, c0 = time.perf_counter(), time.process_time()
    atlas = build_atlas(model, documents(corpus_files([], []), per_line=False), max_tokens=n, context=args.context)
    atlas_s, atlas_cpu = time.perf_counter() - t0, time.process_time() - c0
    forward_last, _, cpu_last = forward()
    floor = (forward_first + forward_last) / 2
    cpu_floor = (cpu_first + cpu_last) / 2
    top = {name: atlas.ranked(name)[0] for name in ("induction", "prev_token", "copy")}
    return {"tokens": atlas.tokens, "forward_tokens": tokens, "forward_s": floor,
            "forward_runs": [forward_first, forward_last], "atlas_s": atlas_s, "ratio": atlas_s / floor,
            "forward_cpu_s": cpu_floor, "atlas_cpu_s": atlas_cpu, "cpu_ratio": atlas_cpu / cpu_floor,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_forward_mb": rss_forward,
            "examples": sum(len(v) for v in atlas.examples.values()), "texts_kept": len(atlas.texts), "top": top,
            "model": args.model}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", action="append", default=None,
                   help="corpus sizes in tokens, comma-separated or repeated (default 50000,200000)")
    p.add_argument("--sizes", default=None, help=argparse.SUPPRESS)  # the old name of --tokens
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quick", action="store_true", help="4,000 tokens only")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(args)))
        return 0
    given = (args.tokens or []) + ([args.sizes] if args.sizes else [])
    try:
        sizes = [4000] if args.quick else [int(s.replace("_", "")) for g in (given or ["50000,200000"])
                                          for s in g.split(",") if s.strip()]
    except ValueError:
        p.error("--tokens takes whole numbers, e.g. --tokens 50000,200000")
    if not sizes or min(sizes) < 1:
        p.error("--tokens takes positive numbers, e.g. --tokens 50000,200000")
    rows = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--child", str(n), "--context", str(args.context), "--threads",
               str(args.threads), "--model", args.model]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"atlas of {rows[0]['model']}, every head, bundled corpus, segments of {args.context} tokens, "
          f"{args.threads} thread(s); load average at the end {load}\n")
    print("| tokens | forward alone (s) | atlas (s) | atlas / forward | CPU: forward (s) | CPU: atlas (s) | "
          "CPU: atlas / forward | tokens/s (atlas) | RSS after forward (MB) | peak RSS (MB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['tokens']:,} | {r['forward_s']:.1f} | {r['atlas_s']:.1f} | {r['ratio']:.2f}x | "
              f"{r['forward_cpu_s']:.1f} | {r['atlas_cpu_s']:.1f} | {r['cpu_ratio']:.2f}x | "
              f"{r['tokens'] / r['atlas_s']:,.0f} | {r['rss_forward_mb']:,.0f} | {r['peak_rss_mb']:,.0f} |")
    print("\nTargets: atlas / forward <= 1.5x (issue 27: the same run), peak RSS <= 2,048 MB at any corpus size.")
    for r in rows:
        print(f"\n{r['tokens']:,} tokens: {r['examples']:,} examples kept, pointing into {r['texts_kept']:,} "
              f"segments; forward runs {', '.join(f'{x:.1f}' for x in r['forward_runs'])} s; highest: "
              + "; ".join(f"{k} L{l}H{h} {v:.3f}" for k, (l, h, v) in r["top"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
