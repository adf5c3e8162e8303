"""What a long forward's malloc settings leave behind for the short runs after it (core.heap; CI's soak failure of
2026-12-03): VmRSS growth over `--runs` MiniLM runs of varied length (tests/api/test_soak_lengths.soak: its
warm-up, then log-uniform lengths from 3 to 512 tokens), on oneDNN's packed product as the soak runs it, after 300
runs on the default product path (MKL's on an Intel CPU) as earlier tests leave a suite's process. One fresh child
process a case:

- `dynamic`: glibc's own thresholds, never set (the process before any long forward);
- `kept`: the 1 GiB thresholds of a long forward left for the process (the code before 2026-12-03);
- `after`: heap.large_blocks_kept() entered and left (fixed thresholds of glibc's order put back), heap.tidy()
  switched off;
- `after + tidy`: the same with heap.tidy() after every forward (the code since).

    python benchmarks/bench_heap_soak.py [--runs 1000] [--cases dynamic,kept,after,after+tidy]

Memory, not time: run it with nothing beside it all the same (a case takes about a minute at 1,000 runs, 2 cores).

Its run of 2026-12-03 (Intel Xeon, 1,000 runs, the test suite beside it): dynamic +9.4 MB, kept +0.0 MB, after
+0.1 MB, after + tidy -44.2 MB. So this history did not fragment the heap as the whole suite's process had (+275 MB
over the soak's 10,000 runs in CI): the growth depends on the heap's past, which this script does not yet recreate.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = ("dynamic", "kept", "after", "after+tidy")

CHILD = """
import json, random, sys, time
sys.path.insert(0, {root!r})
from attn_explorer.core import heap, linear
from tests.api.test_soak_lengths import soak
import attn_explorer as ax
case, runs = {case!r}, {runs}
if case == "kept":
    heap._set(heap.KEEP)
elif case.startswith("after"):
    with heap.large_blocks_kept():
        pass
if case in ("kept", "after"):
    heap.tidy = lambda: False  # the code before the fix: no trim between runs
m = ax.load_model("minilm", device="cpu")
rng = random.Random(1)
for _ in range(300):  # the default product path first, as a suite's earlier tests
    m.run(" ".join(["word"] * rng.randint(3, 500)), max_tokens=510)
linear.path_choice = "packed"
t0 = time.perf_counter()
grown, lengths = soak(m, runs=runs)
print(json.dumps({{"grown": grown, "seconds": time.perf_counter() - t0, "lengths": len(set(lengths))}}))
"""


def run_case(case: str, runs: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), case=case, runs=runs)],
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{case}: the child failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad or args.runs < 1:
        print(f"error: unknown case {bad[0]!r} (cases: {', '.join(CASES)})" if bad else "error: --runs must be >= 1",
              file=sys.stderr)
        return 2
    print(f"| case | VmRSS growth over {args.runs:,} runs | seconds (its warm-up too) |")
    print("|---|---:|---:|")
    for case in cases:
        r = run_case(case, args.runs)
        print(f"| {case} | {r['grown']:.1f} MB | {r['seconds']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
