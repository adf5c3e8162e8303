"""Attention's cost against n on this machine: exact, FlashAttention-style, windowed, linear, SDPA.

12 heads, d_k = 64, batch 1, float32 on the CPU, through the same sweep the `cost` command and
the Cost page use (attn_explorer.cost.measure). Fewer timed runs at large n keep the whole run
to a few minutes. Prints a markdown report and writes it to --out, with these checks:

- chunked at n = 16384 peaks at ≤ 300 MB (naive would need ~12.9 GB for one layer's scores);
- chunked reaches n = 65536 within the default memory budget;
- chunked is within 2× of SDPA's time at n = 4096;
- memory slopes: naive 2 ± 0.2, chunked 1 ± 0.2.

    python benchmarks/bench_cost.py [--out docs/bench_cost.md] [--quick]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attn_explorer.cost.fit import slopes  # noqa: E402
from attn_explorer.cost.measure import SweepConfig, sweep  # noqa: E402
from attn_explorer.cost.memory import default_budget, human_bytes  # noqa: E402

HEADS, D_K = 12, 64
# variant -> the largest n it is asked for (naive's last size is there to show the guard)
LARGEST = {"naive": 16384, "sdpa": 16384, "chunked": 65536, "window": 65536, "linear": 65536}
ORDER = ("naive", "sdpa", "chunked", "window", "linear")


def repeats_for(n: int) -> int:
    return 5 if n <= 4096 else 3 if n <= 16384 else 1


def load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_cost.md"))
    ap.add_argument("--quick", action="store_true", help="stop at n = 4096 (a smoke run, no checks of large n)")
    args = ap.parse_args(argv)

    ns = [256 << i for i in range(9)]  # 256 … 65536
    if args.quick:
        ns = [n for n in ns if n <= 4096]
    budget = default_budget("cpu")
    load_before, began = load(), time.perf_counter()
    records: list[dict] = []
    for n in ns:
        impls = [v for v in ORDER if n <= LARGEST[v]]
        cfg = SweepConfig(ns=[n], impls=impls, heads=HEADS, d_k=D_K, repeats=repeats_for(n), budget_bytes=budget)
        for rec in sweep(cfg):
            d = rec.to_dict()
            records.append(d)
            shown = f"{d['ms']:.1f} ms, {human_bytes(d['peak_bytes'])}" if d["status"] == "ok" else d["message"]
            print(f"  n = {n:>6} {d['impl']:<8} {shown}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - began

    lines = [
        "# Cost lab benchmark",
        "",
        f"`python benchmarks/bench_cost.py` on {datetime.date.today().isoformat()}: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads. "
        f"B = 1, {HEADS} heads, d_k = {D_K}, float32 on the CPU. Memory budget {human_bytes(budget)} "
        f"(half of MemAvailable). Load average before / after: {load_before} → {load()} (the machine is shared, "
        f"so times are noisy; memory is the allocator's count and does not vary). Whole run {wall / 60:.1f} min.",
        "",
        "Time: median of the timed runs after one warm-up (5 runs up to n = 4096, 3 up to 16384, then 1). "
        "Peak: bytes of tensors alive at once during one call, from torch's CPU allocator events "
        "(`torch.profiler`, `profile_memory=True`); inputs excluded, output included. "
        "Error: ‖out − exact‖ / ‖exact‖ against naive's output at the same n (SDPA's where naive did not run), "
        "on random q, k, v.",
        "",
        "| n | variant | median ms | runs | peak MB | guard predicted MB | rel. error | note |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for d in records:
        ok = d["status"] == "ok"
        err = "" if d["rel_error"] is None else f"{d['rel_error']:.1e}" + ("" if d["reference"] == "naive" else f" (vs {d['reference']})")
        lines.append(
            f"| {d['n']} | {d['impl']} | {d['ms']:.1f} | {len(d['ms_runs'])} | {d['peak_bytes'] / 1e6:.1f} | "
            f"{d['predicted_bytes'] / 1e6:.1f} | {err} | |" if ok else
            f"| {d['n']} | {d['impl']} | – | – | – | {d['predicted_bytes'] / 1e6:.0f} | | {d['message']} |")

    t_fit, m_fit = slopes(records, "ms"), slopes(records, "peak_bytes")
    lines += ["", "Slopes p of a·n^p on log-log axes, fitted over the larger half of each variant's sizes "
              "(where a fixed cost no longer hides the growth):", "",
              "| variant | time slope | memory slope | fitted over n |", "|---|---:|---:|---|"]
    for v in ORDER:
        t, m = t_fit.get(v), m_fit.get(v)
        if t or m:
            f = t or m
            lines.append(f"| {v} | {t.p:.2f} | {m.p:.2f} | {f.n_min}–{f.n_max} ({f.points} sizes) |" if t and m else
                         f"| {v} | {t.p if t else '–'} | {m.p if m else '–'} | |")

    at = {(d["n"], d["impl"]): d for d in records}
    checks: list[tuple[bool, str]] = []
    if not args.quick:
        c16 = at.get((16384, "chunked"))
        naive16 = at.get((16384, "naive"))
        if c16 and c16["status"] == "ok":
            checks.append((c16["peak_bytes"] <= 300e6,
                           f"chunked at n = 16384 peaks at {human_bytes(c16['peak_bytes'])} (≤ 300 MB); naive "
                           f"{naive16['message'] if naive16 and naive16['status'] != 'ok' else 'ran'}; its scores "
                           f"alone are {human_bytes(c16['matrix_bytes'])}"))
        c64 = at.get((65536, "chunked"))
        checks.append((bool(c64) and c64["status"] == "ok",
                       f"chunked reaches n = 65536 within the default budget ({human_bytes(budget)}): "
                       + (f"{c64['ms'] / 1000:.1f} s, peak {human_bytes(c64['peak_bytes'])}" if c64 and c64["status"] == "ok"
                          else (c64 or {}).get("message", "not run"))))
    c4, s4 = at.get((4096, "chunked")), at.get((4096, "sdpa"))
    if c4 and s4 and c4["status"] == s4["status"] == "ok":
        checks.append((c4["ms"] <= 2 * s4["ms"],
                       f"chunked within 2× of SDPA at n = 4096: {c4['ms']:.0f} ms vs {s4['ms']:.0f} ms "
                       f"({c4['ms'] / s4['ms']:.2f}×); naive {at[4096, 'naive']['ms']:.0f} ms"))
    if m_fit.get("naive"):
        checks.append((abs(m_fit["naive"].p - 2) <= 0.2, f"naive memory slope {m_fit['naive'].p:.2f} (2 ± 0.2)"))
    if m_fit.get("chunked"):
        checks.append((abs(m_fit["chunked"].p - 1) <= 0.2, f"chunked memory slope {m_fit['chunked'].p:.2f} (1 ± 0.2)"))
    lines += ["", "Checks:", ""] + [f"- {'PASS' if ok else 'FAIL'}: {text}" for ok, text in checks]

    report = "\n".join(lines) + "\n"
    print(report)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(report, encoding="utf-8")
    os.replace(tmp, out)
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(ok for ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
