"""Memory of many runs at varied lengths: VmRSS growth of MiniLM on core.linear's fast path (rows padded
to buckets, and as before: every row count as it comes) against plain F.linear, in the same run.

oneDNN compiles and keeps one kernel per input shape; a text box that sends every length makes one per
length and weight shape (see core/linear.py). Each configuration runs in a fresh process (the kernel
cache is per process), `repeats` times; the table gives the median growth with min–max, and the ratio
to F.linear. Two workloads:

- live edits: `edits` texts of 1–40 random words (seeded) through `Model.run`, as the text box sends them;
- every length: each length from 1 to 512 tokens once, in a seeded random order, through `Model.run`
  with `max_tokens`.

Growth is VmRSS (/proc/self/status) after the last run minus VmRSS after a warm-up of 20 runs of one
short sentence, both after gc.collect(). Torch runs on all cores but one, as the window's model jobs do.

    python benchmarks/bench_memory_lengths.py [--edits 3000] [--repeats 3] [--out docs/bench_memory_lengths.md]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = {  # name -> (fast_path_enabled, bucketing_enabled)
    "fast path, rows bucketed (now)": (True, True),
    "fast path, every row count (before)": (True, False),
    "F.linear (fast path off)": (False, True),
}
WORDS = ("the animal did not cross street because it was too tired a quick brown fox jumps over lazy dog "
         "attention lets every token look at others").split()


def vmrss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def child(mode: str, workload: str, edits: int) -> dict:
    """One configuration in this (fresh) process: RSS growth and run time."""
    import gc
    import random

    import torch

    import attn_explorer as ax
    from attn_explorer.core import linear

    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    linear.fast_path_enabled, linear.bucketing_enabled = MODES[mode]
    model = ax.load_model("minilm", device="cpu")
    rng = random.Random(0)
    for _ in range(20):
        model.run("The animal didn't cross the street because it was too tired.")
    gc.collect()
    base = vmrss_mib()
    t0 = time.perf_counter()
    if workload == "edits":
        for _ in range(edits):
            model.run(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))))
        runs = edits
    else:
        text = " ".join(rng.choice(WORDS) for _ in range(600))  # more than 512 tokens
        lengths = list(range(3, 513))  # MiniLM's shortest input is [CLS] word [SEP]
        rng.shuffle(lengths)
        for n in lengths:
            assert model.run(text, max_tokens=n).num_tokens == n
        runs = len(lengths)
    seconds = time.perf_counter() - t0
    gc.collect()
    return {"grown": vmrss_mib() - base, "ms_per_run": seconds * 1000 / runs, "runs": runs}


def measure(mode: str, workload: str, edits: int) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, workload, "--edits", str(edits)]
    done = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(edits: int, repeats: int) -> str:
    titles = {"edits": f"{edits:,} live edits of 1–40 words", "every": "every length from 3 to 512 tokens once"}
    parts = []
    for workload, title in titles.items():
        got: dict[str, list[dict]] = {m: [] for m in MODES}
        for _ in range(repeats):  # interleaved, so drift hits every mode alike
            for mode in MODES:
                got[mode].append(measure(mode, workload, edits))
        ref = statistics.median(r["grown"] for r in got["F.linear (fast path off)"])
        rows = [f"### {title}", "",
                "| | RSS growth MB, median | min–max | **/ F.linear** | ms per run, median |",
                "|---|---:|---:|---:|---:|"]
        for mode, runs in got.items():
            grown = [r["grown"] for r in runs]
            med = statistics.median(grown)
            ratio = med / ref if ref > 0 else float("nan")
            rows.append(f"| {mode} | {med:.1f} | {min(grown):.1f}–{max(grown):.1f} | **{ratio:.2f}** | "
                        f"{statistics.median(r['ms_per_run'] for r in runs):.1f} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edits", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "WORKLOAD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.edits)))
        return
    threads = max(1, (os.cpu_count() or 2) - 1)
    text = (f"## Memory at varied lengths, MiniLM, {threads} torch thread(s), {args.repeats} fresh process(es) "
            "per configuration\n\n" + table(args.edits, args.repeats))
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
