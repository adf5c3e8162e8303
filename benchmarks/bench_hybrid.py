"""Hybrid models (issue 25): our chunked recurrent forward against transformers' torch path, and what a pooled view
of a recurrent head's implicit map costs next to a softmax head's, both computed from a lazy run's kept quantities.

Two tiny random hybrids, built here (the parity tests' configs, longer positions), the same weights on both sides:
- Qwen3.5 (`qwen3_5_text`: three Gated DeltaNet layers, one gated softmax layer);
- Granite 4 hybrid (`granitemoehybrid`: Mamba-2, attention, Mamba-2; Mamba chunk 256 as the real checkpoints).

1. Forward at --sizes tokens (default 1,024 and 4,096), random token ids, no maps: ours (`m.module`, the chunked
   delta rule / SSD scan) against transformers' `model.model` (its torch functions: no CUDA kernels on CPU; softmax
   layers through --hf-attn, sdpa by default). The two alternate (who goes first alternates too) and the ratio is
   the median of the pairs' ratios, so a shared machine's load falls on both.
2. Views at --view-sizes tokens (default 4,096; --long adds 32,768): one lazy forward (core.hooks.Hooks(keep=True):
   q, k, g, β for DeltaNet; B, C, dt, A for Mamba-2; q, k, lse for softmax), then one head's map pooled to
   1,024 × 1,024 by max (`LazyAttention.attention(l, h, pool=1024)`) on a recurrent layer and on the softmax
   layer. The issue's target: the recurrent view ≤ 2× the softmax one.

Medians of --repeats (1 at 32,768); the views report wall and CPU time. One markdown table; docs/bench_hybrid.md is
written only with --write.

    python benchmarks/bench_hybrid.py [--sizes 1024,4096] [--view-sizes 4096] [--long] [--repeats 5] [--threads 2]
                                      [--hf-attn sdpa] [--write]
    python benchmarks/bench_hybrid.py --sizes 64 --view-sizes 64 --repeats 1    # a smoke run in seconds
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LONG = 32768


def _build(name: str, positions: int):
    """(label, our model, transformers' model) for a tiny random hybrid saved in a temporary folder."""
    import transformers

    import attn_explorer as ax
    from tests.hub import test_parity_rotary_families as rotary

    folder = Path(tempfile.mkdtemp(prefix=f"bench_hybrid_{name}_"))
    if name == "qwen3_5":
        from tests.hub import test_parity_qwen35 as q35

        rotary.make_folder(folder, name, q35.CASES, dict(q35.COMMON, max_position_embeddings=positions), seed=300)
        label = "tiny Qwen3.5 (3 Gated DeltaNet + 1 softmax layer)"
    else:
        from tests.hub import test_parity_mamba_hybrids as mh

        cfg, model, extra = mh.CASES["granite4"]
        rotary.make_folder(folder, name, {name: (cfg, model, dict(extra, mamba_chunk_size=256))},
                           dict(rotary.COMMON, max_position_embeddings=positions))
        label = "tiny Granite 4 hybrid (Mamba-2, attention, Mamba-2; MoE)"
    ours = ax.load_model(str(folder), device="cpu")
    return label, ours, folder, transformers


def _hf(transformers, folder: Path, attn: str):
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation=attn,
                                                             dtype=torch.float32).eval()


def _ids(n: int, vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (1, n), generator=torch.Generator().manual_seed(n))


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def _wall_cpu(fn) -> tuple[float, float]:
    """(wall ms, this process's CPU ms: every thread's, so it sees the work a loaded machine hides in waiting)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000


def forwards(m, hf, n: int, repeats: int) -> dict:
    """Ours and transformers' forward at n tokens, alternated; medians and the median of the pairs' ratios."""
    ids = _ids(n, 300)  # the tiny tokenizer's vocabulary (tests.hub.test_parity_rotary_families.VOCAB)
    ours_fn = lambda: m.module(input_ids=ids, output_attentions=False)  # noqa: E731
    theirs_fn = lambda: hf.model(input_ids=ids)  # noqa: E731
    with torch.inference_mode():
        ours_fn(), theirs_fn()  # warm-up
        ours, theirs = [], []
        for i in range(max(1, repeats)):
            pair = [(ours, ours_fn), (theirs, theirs_fn)]
            for out, fn in (pair if i % 2 == 0 else pair[::-1]):
                out.append(_ms(fn))
    ratios = [a / b for a, b in zip(ours, theirs)]
    return {"n": n, "ours": statistics.median(ours), "theirs": statistics.median(theirs),
            "ratio": statistics.median(ratios)}


def views(m, n: int, repeats: int) -> dict:
    """One lazy forward at n tokens, then a 1,024² pooled view of a recurrent head and of a softmax head."""
    from attn_explorer.api.lazy import LazyAttention
    from attn_explorer.core.hooks import Hooks

    ids = _ids(n, 300)
    hooks = Hooks(keep=True)
    with torch.inference_mode():
        t_fwd = _ms(lambda: m.module(input_ids=ids, output_attentions=False, hooks=hooks))
    store = LazyAttention.from_kept(hooks.kept)
    kinds = list(m.info.mixers)
    rec = next(i for i, k in enumerate(kinds) if k != "softmax")
    soft = next(i for i, k in enumerate(kinds) if k == "softmax")
    cells = min(1024, n)
    reps = 1 if n >= LONG else max(1, repeats)
    out = {"n": n, "kind": kinds[rec], "lazy_fwd": t_fwd, "kept": store.bytes_kept, "dense": store.dense_bytes}
    for key, layer in (("rec", rec), ("soft", soft)):
        store.attention(layer, 0, pool=min(cells, 16))  # warm-up, small
    times = {"rec": [], "soft": []}
    for i in range(reps):  # alternated, who goes first alternating too
        pair = [("rec", rec), ("soft", soft)]
        for key, layer in (pair if i % 2 == 0 else pair[::-1]):
            times[key].append(_wall_cpu(lambda layer=layer: store.attention(layer, 0, pool=cells)))
    for key, t in times.items():
        out[key], out[key + "_cpu"] = statistics.median(w for w, _ in t), statistics.median(c for _, c in t)
    out["ratio"] = statistics.median(a[0] / b[0] for a, b in zip(times["rec"], times["soft"]))
    out["ratio_cpu"] = statistics.median(a[1] / b[1] for a, b in zip(times["rec"], times["soft"]))
    return out


def _fmt(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"


def table(results: list[tuple[str, list[dict], list[dict]]], args, load: tuple[float, float]) -> str:
    from attn_explorer.budget import human_bytes

    lines = [
        "# Hybrid models benchmark",
        "",
        f"`python benchmarks/bench_hybrid.py --sizes {','.join(map(str, args.sizes))} --view-sizes "
        f"{','.join(map(str, args.view_sizes))} --repeats {args.repeats} --threads {args.threads} --hf-attn "
        f"{args.hf_attn}` on {datetime.date.today()}: {platform.processor() or platform.machine()}, torch "
        f"{torch.__version__} CPU ({args.threads} threads), Python {platform.python_version()}. 1-minute load "
        f"average {load[0]:.1f} before, {load[1]:.1f} after.",
        "",
        "## Forward, no maps: ours (chunked) against transformers' torch path, same weights",
        "",
        "Medians of the alternated runs; ratio = median of each pair's ours / transformers (≤ 1.0× is the target).",
        "",
        "| model | tokens | ours | transformers | ours / transformers |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, fwd, _ in results:
        for r in fwd:
            lines.append(f"| {label} | {r['n']:,} | {_fmt(r['ours'])} | {_fmt(r['theirs'])} | {r['ratio']:.2f}× |")
    lines += [
        "",
        "## One head pooled to 1,024 × 1,024 (max) from a lazy run's kept quantities",
        "",
        "Recurrent / softmax ≤ 2× is the target. kept / dense: the lazy store's bytes over the dense maps' (float32). "
        "Each view: wall time, then this process's CPU time (every thread's: with --threads 1 on a shared machine it "
        "counts the work without the waiting; with more, a thread spinning while its partner waits counts too); the "
        "two views alternate and each ratio is the median of the pairs'.",
        "",
        "| model | tokens | lazy forward | kept / dense | recurrent head (wall, CPU) | softmax head (wall, CPU) | "
        "recurrent / softmax (wall, CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, _, vw in results:
        for r in vw:
            lines.append(f"| {label} | {r['n']:,} | {_fmt(r['lazy_fwd'])} | {human_bytes(r['kept'])} / "
                         f"{human_bytes(r['dense'])} | {_fmt(r['rec'])}, {_fmt(r['rec_cpu'])} ({r['kind']}) | "
                         f"{_fmt(r['soft'])}, {_fmt(r['soft_cpu'])} | {r['ratio']:.2f}×, {r['ratio_cpu']:.2f}× |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,4096", help="forward lengths, comma-separated")
    p.add_argument("--view-sizes", default="4096", help="lazy-view lengths, comma-separated")
    p.add_argument("--long", action="store_true", help=f"also the views at {LONG:,} tokens")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--hf-attn", default="sdpa", help="transformers' attn_implementation for its softmax layers")
    p.add_argument("--models", default="qwen3_5,granite4")
    p.add_argument("--write", action="store_true", help="write docs/bench_hybrid.md")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.view_sizes = [int(s) for s in args.view_sizes.split(",") if s] + ([LONG] if args.long else [])
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    positions = max(args.sizes + args.view_sizes) + 8
    results = []
    for name in args.models.split(","):
        label, m, folder, transformers = _build(name, positions)
        hf = _hf(transformers, folder, args.hf_attn)
        fwd = [forwards(m, hf, n, args.repeats) for n in args.sizes]
        del hf
        vw = [views(m, n, args.repeats) for n in args.view_sizes]
        results.append((label, fwd, vw))
        print(f"{label}: done", file=sys.stderr, flush=True)
    text = table(results, args, (load_before, os.getloadavg()[0]))
    print(text)
    if args.write:
        (ROOT / "docs" / "bench_hybrid.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
