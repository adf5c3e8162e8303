"""Peak memory across model switches (issue 24 D): MiniLM → SmolLM2 → Gemma 3 on the same long text, through the
session the window uses (SessionState: loads, runs, the grid's mosaic filled in as each long run goes), against
Gemma 3's run alone on that text. Target: the switches' peak ≤ 1.5× Gemma's alone.

Each case runs in a fresh child process; its peak is the child's resource.getrusage(RUSAGE_SELF).ru_maxrss, and
its end is VmRSS after the last run (gc.collect() first). A switch frees the old model (and what its runs kept)
before the next one is read, unless it is pinned: `--pin` pins each model as it loads, to show what the pin costs.

The long text is the machine's licence files (/usr/share/common-licenses, then any LICENSE/COPYING files of the
installed Python packages), concatenated and cut to --chars characters: the kind of text the issue's user pasted.
This is a heavy benchmark (three forwards over thousands of tokens); on a shared machine its times are not
meaningful, only its memory.

    python benchmarks/bench_switch_memory.py [--chars 120000] [--pin] [--out docs/bench_switch_memory.md]
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

CASES = {"switches": ["minilm", "smollm2-135m", "gemma3-270m"], "gemma alone": ["gemma3-270m"]}


def long_text(chars: int) -> str:
    """The machine's licence texts, concatenated, cut to `chars` characters (repeated if there are too few)."""
    found = sorted(Path("/usr/share/common-licenses").glob("*"))
    site = Path(os.__file__).parent / "site-packages"
    found += sorted(site.glob("*.dist-info/LICENSE*"))[:200] + sorted(site.glob("*.dist-info/licenses/*"))[:200]
    parts, total = [], 0
    for p in found:
        try:
            if p.is_file():
                t = p.read_text(errors="ignore")
        except OSError:
            continue
        parts.append(t)
        total += len(t)
        if total >= chars:
            break
    text = "\n\n".join(parts) or "The capital of France is Paris. "
    while len(text) < chars:
        text += "\n\n" + text
    return text[:chars]


def vmrss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def child(models: list[str], chars: int, pin: bool) -> dict:
    """Load each model in turn in one session, run the text on it to the end; the peak and end memory."""
    import gc

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from attn_explorer.gui.window.app import get_qapp
    from attn_explorer.session.state import SessionState

    app = get_qapp()
    st = SessionState(device="cpu")
    text = long_text(chars)
    errors: list[str] = []
    st.error_raised.connect(errors.append)

    def wait(cond, limit=3600.0):
        t0 = time.perf_counter()
        while not cond():
            app.processEvents()
            time.sleep(0.01)
            if time.perf_counter() - t0 > limit:
                raise TimeoutError("waited too long")

    steps = []
    st.set_text(text)
    for name in models:
        t0 = time.perf_counter()
        st.load_model(name, want_image=False)
        wait(lambda: not st.runner.loading and st.info is not None and st.info.name == name)
        wait(lambda: not st.busy and st.result is not None and st.result.model == name)
        if pin:
            st.set_pinned(True)
        gc.collect()
        steps.append({"model": name, "tokens": st.result.num_tokens, "lazy": bool(st.result.is_lazy),
                      "s": round(time.perf_counter() - t0, 1), "rss_mib": round(vmrss_mib()),
                      "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})
    st.shutdown()
    gc.collect()
    return {"steps": steps, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "end_mib": vmrss_mib(), "errors": errors[-3:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chars", type=int, default=120_000, help="characters of licence text (about 4 per token)")
    ap.add_argument("--pin", action="store_true", help="pin each model as it loads (kept across switches)")
    ap.add_argument("--out", type=Path, default=None, help="write the table here (markdown)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child.split(","), args.chars, args.pin)))
        return 0
    results = {}
    for case, models in CASES.items():
        cmd = [sys.executable, __file__, "--child", ",".join(models), "--chars", str(args.chars)]
        cmd += ["--pin"] if args.pin and case == "switches" else []
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if res.returncode != 0:
            print(res.stderr[-3000:], file=sys.stderr)
            return 1
        results[case] = json.loads(res.stdout.strip().splitlines()[-1])
        print(case, json.dumps(results[case]), flush=True)
    alone = results["gemma alone"]["peak_mib"]
    lines = [f"Peak memory across model switches, {args.chars:,} characters of licence text"
             + (" (each model pinned)" if args.pin else ""), "",
             "| case | step | tokens | lazy | s | RSS after (MiB) | peak so far (MiB) |", "|---|---|---|---|---|---|---|"]
    for case, r in results.items():
        for s in r["steps"]:
            lines.append(f"| {case} | {s['model']} | {s['tokens']:,} | {s['lazy']} | {s['s']} | {s['rss_mib']:,} | "
                         f"{s['peak_mib']:,} |")
    lines += ["", "| case | peak (MiB) | end (MiB) | peak ÷ Gemma alone |", "|---|---|---|---|"]
    for case, r in results.items():
        lines.append(f"| {case} | {r['peak_mib']:,.0f} | {r['end_mib']:,.0f} | {r['peak_mib'] / alone:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
