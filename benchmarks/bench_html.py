"""The HTML page (api/html.py): its size, the time to build it, and the time headless Chromium takes to
draw it, for MiniLM at 128 tokens (6 × 12 × 128², the issue's 2 MB case), MiniLM at 512 tokens (pooled
to 256 a side) and DINOv2-S at 224 px (12 × 6 × 257², with the picture).

    python benchmarks/bench_html.py [--runs 5] [--out docs/bench_html.md]

Build: median (min) ms of `page_html` over --runs after one warm-up, and the same against the model's own
forward pass (`m.run`, same run): only that ratio carries across machines. Render: ms from opening the
file to the viewer's first view drawn (data-ax-ready), and from a click on a tab to that view drawn, in
Debian's chromium driven by Playwright; "—" without them.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attn_explorer as ax  # noqa: E402
from attn_explorer.api.html import page_data, page_html  # noqa: E402

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


def browser_times(path: Path, runs: int, views: tuple[str, ...]) -> dict[str, float] | None:
    """Median ms to the first view drawn ("open") and to each other view after a tab click."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if exe is None:
        return None
    out: dict[str, list[float]] = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        for _ in range(runs + 1):  # the first is a warm-up
            pg = b.new_page(viewport={"width": 1280, "height": 900})
            t0 = time.perf_counter()
            pg.goto(path.as_uri())
            pg.wait_for_selector(".ax-root[data-ax-ready='1']", timeout=60000)
            times = {"open": (time.perf_counter() - t0) * 1000}
            for v in views:
                t0 = time.perf_counter()
                pg.click(f".ax-tab[data-view={v}]")
                pg.wait_for_selector(f".ax-root[data-ax-view='{v}']", timeout=60000)
                times[v] = (time.perf_counter() - t0) * 1000
            pg.close()
            if _ > 0:
                for k, t in times.items():
                    out.setdefault(k, []).append(t)
        b.close()
    return {k: statistics.median(v) for k, v in out.items()}


def case(name: str, model, x, kw: dict, runs: int, views: tuple[str, ...], folder: Path) -> tuple:
    r = model.run(x, **kw)
    L, H, N, _ = r.attentions.shape
    fwd, _ = timed(lambda: model.run(x, **kw), runs)
    build, build_min = timed(lambda: page_html(r), runs)
    text = page_html(r)
    f = folder / f"{name.split()[0].lower()}-{N}.html"
    f.write_text(text, encoding="utf-8")
    n = page_data(r)["n"]
    shown = f"{L} × {H} × {n}²" + (" (pooled)" if n < N else "")
    b = browser_times(f, runs, views)
    render = "—" if b is None else f"{b['open']:.0f}"
    switch = "—" if b is None else ", ".join(f"{v} {b[v]:.0f}" for v in views)
    return (name, N, shown, len(text.encode("utf-8")) / 1e6, build, build_min, fwd, build / fwd, render, switch)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    minilm = ax.load_model("minilm", device="cpu")
    dino = ax.load_model("dinov2-small", device="cpu")
    cat = str(ROOT / "resources" / "samples" / "chelsea-cat.jpg")
    text_views, image_views = ("head", "tokens", "lines"), ("head", "overlay")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [
            case("MiniLM, 128 tokens", minilm, TEXT * 20, {"max_tokens": 128}, args.runs, text_views, Path(tmp)),
            case("MiniLM, 512 tokens", minilm, TEXT * 60, {"max_tokens": 512}, args.runs, text_views, Path(tmp)),
            case("DINOv2-S, 224 px", dino, cat, {}, args.runs, image_views, Path(tmp)),
        ]
    lines = [
        f"HTML page: size, build and render ({datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"median of {args.runs} runs)",
        "",
        "| run | tokens | maps stored | HTML (MB) | build ms (min) | forward ms | build × forward | "
        "Chromium: open → first view ms | tab click → view drawn ms |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, N, shown, mb, build, bmin, fwd, ratio, render, switch in rows:
        lines.append(f"| {name} | {N} | {shown} | {mb:.2f} | {build:.0f} ({bmin:.0f}) | {fwd:.0f} | {ratio:.1f} | "
                     f"{render} | {switch} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
