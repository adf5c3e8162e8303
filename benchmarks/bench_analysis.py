"""Time the analyses as one GUI update pays for them: rollout, value-weighted norms, head statistics and
head search, at 257 image tokens (DINOv2-S, 224 px) and 512 text tokens (MiniLM), against the same
model's own forward pass (`m.run`) in the same run.

    python benchmarks/bench_analysis.py [--runs 5] [--threads 2] [--out docs/bench_analysis.md]

Every number is the median (and minimum) of --runs runs after one warm-up, in ms per update. The
"× forward" column divides by the median of `m.run` on the same input: only that ratio carries
across machines.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis.norms import model_norms, out_projections, value_weighted_norms  # noqa: E402
from attn_explorer.analysis.rollout import rollout_layers  # noqa: E402
from attn_explorer.analysis.search import preset_target, rank_heads  # noqa: E402
from attn_explorer.analysis.stats import head_stats  # noqa: E402

TEXT = "The animal didn't cross the street because it was too tired. "


def timed(fn, runs: int) -> tuple[float, float]:
    """(median, min) wall time of fn() in ms, after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), min(times)


def case_rows(name: str, model, x, kw: dict, runs: int) -> list[tuple]:
    r = model.run(x, **kw)
    L, H, N, _ = r.attentions.shape
    fwd = timed(lambda: model.run(x, **kw), runs)
    # the pure norms formula alone, on one layer's captured values (what a redraw would pay without a forward)
    cap = {L - 1: {}}
    prep = model.prepare(x, **{k: v for k, v in kw.items() if k in ("max_tokens", "image_size")})
    model._forward(prep.inputs, captures=cap, output_attentions=False)
    mha = out_projections(model.module)[L - 1]
    v = cap[L - 1]["values"][0].float().numpy()
    w_o = mha.out.weight.detach().float().view(-1, mha.num_heads, mha.head_dim).numpy()
    patch = model.info.patch_size if r.grid is not None else None
    target = preset_target("previous", N)
    steps = [
        (f"forward: `m.run` (reference), {L}×{H} maps", lambda: model.run(x, **kw)),
        ("rollout, every layer, mean fusion", lambda: rollout_layers(r.attentions)),
        ("rollout, every layer, max fusion, discard 0.9", lambda: rollout_layers(r.attentions, "max", 0.9)),
        ("norms, every layer (`model_norms`: its own forward included)", lambda: model_norms(model, x, None, **kw)),
        ("norms formula alone, one layer (values and W_O given)",
         lambda: value_weighted_norms(r.attentions[L - 1], v, w_o)),
        ("head statistics, every head (`head_stats`)",
         lambda: head_stats(r.attentions, r.special, r.grid, r.patch_offset, patch)),
        ("head search, previous-token pattern (`rank_heads`)", lambda: rank_heads(r.attentions, target)),
    ]
    rows = []
    for what, fn in steps:
        med, lo = fwd if what.startswith("forward") else timed(fn, runs)
        rows.append((name, N, what, med, lo, med / fwd[0]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_analysis.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    from PIL import Image

    from attn_explorer.resources import resource_path

    photo = Image.open(resource_path("samples", "chelsea-cat.jpg")).convert("RGB")
    rows = []
    rows += case_rows("DINOv2-S, 224 px", ax.load_model("dinov2-small", device="cpu"), photo, {"image_size": 224},
                      args.runs)
    rows += case_rows("MiniLM-L6", ax.load_model("minilm", device="cpu"), TEXT * 40, {"max_tokens": 512}, args.runs)
    load_after = os.getloadavg()[0]
    lines = [
        "# Analyses benchmark",
        "",
        f"`python benchmarks/bench_analysis.py --runs {args.runs} --threads {args.threads}` on "
        f"{datetime.date.today()}: {platform.processor() or platform.machine()}, torch {torch.__version__} CPU "
        f"({args.threads} threads), NumPy {np.__version__}, Python {platform.python_version()}. 1-minute load "
        f"average {load_before:.1f} before, {load_after:.1f} after (other processes share the machine).",
        "",
        "ms per update: what one redraw of the page pays when the input changes. × forward = this step's median "
        "over the same model's `m.run` median in this run.",
        "",
        "| model | tokens | step | median (ms) | min (ms) | × forward |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name, n, what, med, lo, ratio in rows:
        lines.append(f"| {name} | {n} | {what} | {med:,.1f} | {lo:,.1f} | {ratio:.2f} |")
    lines += ["", f"{args.runs} runs after one warm-up each; the minimum is the better guide when the machine is busy."]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
