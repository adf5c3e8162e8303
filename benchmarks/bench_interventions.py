"""Head interventions on SmolLM2-135M at 32 tokens, same run: the full single-head ablation scan (270 heads)
batched (one ablated head per copy of the input, as many copies per forward pass as memory allows) against
270 separate forward passes (batch 1, the same hook and metric), and the activation-patching scans (per head:
270 cells; per (layer, position): 30 × 32 = 960 cells), each against one plain forward pass. Medians of
--runs, with min–max; the two ablation scans must give the same grid.

    python benchmarks/bench_interventions.py [--runs 3] [--threads 2] [--out docs/bench_interventions.md]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When John and Mary went to the store, Mary gave a drink to"
LONG = ("When Mary and John went to the store after a long and tiring day at work in the middle of the old city, "
        "John gave a cold drink and a sandwich to")  # cut to 32 tokens
N = 32


def timed(fn, runs: int, what: str = "") -> tuple[float, float, float, object]:
    out, times = None, []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    if what:
        print(f"  {what}: {[round(t, 3) for t in times]} s", file=sys.stderr, flush=True)
    return statistics.median(times), min(times), max(times), out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    import attn_explorer as ax
    from attn_explorer.analysis import interventions as iv

    m = ax.load_model("smollm2-135m", device="cpu")
    run_kw = {"max_tokens": N}
    prep = iv.prepare(m, LONG, run_kw)
    assert m.token_count(prep) == N, m.token_count(prep)
    metric = iv.metric(m, LONG, target=" Mary", foil=" John", **run_kw)

    def plain():
        with torch.inference_mode():
            return iv.forward(m, prep.inputs, run_kw=run_kw)

    plain()  # warm-up
    rows = []
    fwd = timed(plain, max(5, args.runs), "one forward")
    rows.append(("one plain forward pass (reference)", 1, fwd))
    batched = timed(lambda: iv.ablation_scan(m, LONG, metric, **run_kw), args.runs, "batched scan")
    single = timed(lambda: iv.ablation_scan(m, LONG, metric, batch=1, **run_kw), args.runs, "270 separate")
    same = float(np.abs(batched[3].values - single[3].values).max())
    rows.append(("ablation scan, 270 heads, batched", batched[3].passes, batched))
    rows.append(("ablation scan, 270 separate forward passes", single[3].passes, single))
    clean_kw = {}  # the IOI pair is 15 tokens each: patching needs the same count, so no cut
    heads = timed(lambda: iv.patching_scan(m, CLEAN, CORRUPT, metric=None, per="head", target=" Mary", foil=" John",
                                           **clean_kw), args.runs, "patch per head")
    rows.append(("patching scan per head (270 cells)", heads[3].passes, heads))
    pos = timed(lambda: iv.patching_scan(m, CLEAN, CORRUPT, per="position", target=" Mary", foil=" John",
                                         **clean_kw), args.runs, "patch per position")
    cells = pos[3].values.size
    rows.append((f"patching scan per (layer, position) ({cells} cells)", pos[3].passes, pos))
    lines = [f"SmolLM2-135M, CPU, {args.threads} threads, float32, median of {args.runs} run(s) (min–max). "
             f"Ablation at {N} tokens; batched and separate grids agree within {same:.1e}. Patching on the IOI pair "
             f"({len(heads[3].tokens)} tokens each, no cut), so only its forward-pass column compares.", "",
             "| what | forward passes | median s | min–max s | vs one forward | vs 270 separate |",
             "|---|---|---|---|---|---|"]
    for name, passes, (med, lo, hi, _) in rows:
        versus = f"{med / single[0]:.2f}×" if "ablation" in name or "reference" in name else "— (other input)"
        lines.append(f"| {name} | {passes} | {med:.3f} | {lo:.3f}–{hi:.3f} | {med / fwd[0]:.1f}× | {versus} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
