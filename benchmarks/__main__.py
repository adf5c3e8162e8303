"""`python -m benchmarks`: run every benchmark and write one report, docs/BENCHMARKS.md.

Each script compares against a reference in the same run (transformers eager, naive attention, the
source tree) and reports medians with min–max; only those same-run ratios carry across machines.
The per-script tables also stay in docs/bench_*.md.

    python -m benchmarks [--quick] [--only forward,gui,...]
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {  # name -> (script, title, extra args for a quick run)
    "forward": ("bench_forward.py", "Forward pass against transformers eager", ["--repeats", "5"]),
    "gui": ("bench_gui.py", "Keystroke to paint, cold start", ["--quick"]),
    "dinov2": ("bench_dinov2.py", "DINOv2-S", ["--runs", "2"]),
    "cost": ("bench_cost.py", "The cost of attention against n", ["--quick"]),
    "analysis": ("bench_analysis.py", "Analyses: rollout, value norms, head statistics, search", ["--runs", "2"]),
    "train_vit": ("bench_train_vit.py", "Training the tiny ViT: our modules against torch's", ["--quick"]),
    "smollm2": ("bench_smollm2.py", "SmolLM2-135M: load and generation against transformers", ["--loads", "1", "--tokens", "8"]),
    "faithfulness": ("bench_faithfulness.py", "Relevance: deletion faithfulness on tiny-vit-digits, cost on SmolLM2",
                     ["--runs", "2"]),
}
TEXT = "The animal didn't cross the street because it was too tired."


def machine() -> str:
    import numpy
    import torch

    try:
        from PySide6 import __version__ as pyside
    except ImportError:
        pyside = "not installed"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return "\n".join([
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        f"- Python {platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"NumPy {numpy.__version__}, PySide6 {pyside}",
        f"- 1-minute load average when the report started: {load:.2f}",
    ])


def _median_run(cmd: list[str], runs: int) -> tuple[float, float, float]:
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            subprocess.run(cmd + ["--out", str(Path(d) / "a.npz")], check=True, capture_output=True,
                           env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
            times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


def bundle_section(runs: int) -> str:
    """Size of the frozen one-folder app and its cold start against the source tree, same run."""
    app = ROOT / "dist" / "attn-explorer" / "attn-explorer"
    if not app.is_file():
        return "No bundle in dist/attn-explorer: run `bash packaging/build.sh` first, then this report."
    size = sum(f.stat().st_size for f in app.parent.rglob("*") if f.is_file() and not f.is_symlink())
    export = ["export", "--model", "minilm", "--text", TEXT]
    frozen = _median_run([str(app)] + export, runs)
    source = _median_run([sys.executable, str(ROOT / "main.py")] + export, runs)
    return "\n".join([
        f"Unpacked size of dist/attn-explorer: **{size / 1e6:,.0f} MB**.",
        "",
        f"Cold start to a written .npz (`export --model minilm`), whole process, {runs} runs:",
        "",
        "| | median s | min s | max s |",
        "|---|---:|---:|---:|",
        f"| frozen app | {frozen[0]:.2f} | {frozen[1]:.2f} | {frozen[2]:.2f} |",
        f"| from source (`python main.py`) | {source[0]:.2f} | {source[1]:.2f} | {source[2]:.2f} |",
        f"| frozen / source | {frozen[0] / source[0]:.2f} | | |",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few repeats: check that everything runs")
    ap.add_argument("--only", help=f"comma-separated subset of {', '.join(SCRIPTS)}, bundle")
    ap.add_argument("--out", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    a = ap.parse_args(argv)
    chosen = a.only.split(",") if a.only else [*SCRIPTS, "bundle"]
    parts = ["# Benchmarks", "", f"Written by `python -m benchmarks` on {time.strftime('%Y-%m-%d %H:%M')}.",
             "", machine(), ""]
    for name in chosen:
        if name == "bundle":
            parts += ["## The frozen app", "", bundle_section(1 if a.quick else 5), ""]
            continue
        script, title, quick = SCRIPTS[name]
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / f"{name}.md"
            cmd = [sys.executable, str(ROOT / "benchmarks" / script), "--out", str(out)] + (quick if a.quick else [])
            print("$", " ".join(cmd[1:]), flush=True)
            t0 = time.perf_counter()
            done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
            if done.returncode != 0 or not out.is_file():
                parts += [f"## {title}", "", f"`{script}` failed (exit {done.returncode}).", ""]
                continue
            body = out.read_text(encoding="utf-8").strip()
            shutil.copy(out, ROOT / "docs" / f"bench_{name}.md")
        body = "\n".join(("##" + ln) if ln.startswith("#") else ln for ln in body.splitlines())  # below the section
        parts += [f"## {title}", "", f"`benchmarks/{script}`, {time.perf_counter() - t0:.0f} s.", "", body, ""]
    Path(a.out).write_text("\n".join(parts) + "\n", encoding="utf-8")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
