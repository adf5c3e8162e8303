"""`attn-explorer cost`: measure attention's time and peak memory against n, print a table.

    python main.py cost --n 256,512,...,16384 --impl naive,chunked,window,linear,sdpa
    python main.py cost --real-qkv --model minilm --text "The animal didn't cross the street" --layer 3

Rows print as each point is measured; the fitted slopes follow, and a warning when the noise
verdict (cost.fit.noise_verdict, the same one the Cost page shows) finds the timings unreliable.
With --real-qkv the variants run instead on one layer's q, k, v of a loaded model for the given
text, next to random q, k, v of the same shape. This module is imported every time the CLI
starts, so it imports torch (through cost.measure) only inside `run`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

from attn_explorer.cost.variants import NAMES as IMPLS
from attn_explorer.cost.variants import get as get_variant
from attn_explorer.errors import UserError
from attn_explorer.validate import positive_int

ERROR_NOTE = "rel. error: relative error of the output vs exact, ‖out − exact‖ / ‖exact‖ (Frobenius norms)"
DEFAULT_NS = "256,512,...,4096"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", default=DEFAULT_NS, metavar="LIST",
                   help="sequence lengths, comma-separated; '256,512,...,16384' continues the ratio "
                        f"of the first two up to the last (default {DEFAULT_NS})")
    p.add_argument("--impl", default=",".join(IMPLS), metavar="LIST",
                   help=f"variants to measure, comma-separated, from {', '.join(IMPLS)} (default: all)")
    p.add_argument("--heads", default="12", metavar="H", help="attention heads (default 12)")
    p.add_argument("--dk", default="64", metavar="D", help="width of each head's q, k and v (default 64)")
    p.add_argument("--batch", default="1", metavar="B", help="batch size (default 1)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, mps or auto")
    p.add_argument("--dtype", default="float32", help="float32 (default); bfloat16 or float16 on a GPU")
    p.add_argument("--causal", action="store_true", help="decoder-style causal masking")
    p.add_argument("--window", default="128", metavar="W", help="window attention's window in tokens (default 128)")
    p.add_argument("--block", default="auto,256", metavar="QB[,KB]",
                   help="chunked attention's query and key tile sizes; QB 'auto' grows with n from 128 to 1024 "
                        "(default auto,256)")
    p.add_argument("--repeats", default="3", metavar="R", help="timed runs per point, median reported (default 3)")
    p.add_argument("--budget-gb", default=None, metavar="G",
                   help="memory guard: skip runs predicted to need more (default: half of available memory "
                        "on CPU, 80%% of free memory on a GPU)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write every record and the slopes as JSON")
    p.add_argument("--real-qkv", action="store_true",
                   help="measure the variants on one layer's own q, k, v of --model for --text, next to random "
                        "q, k, v of the same shape (instead of a sweep over n)")
    p.add_argument("--model", default="minilm", help="with --real-qkv: the model to load (default minilm)")
    p.add_argument("--text", default=None, help="with --real-qkv: the input text (default: the explorer's sample)")
    p.add_argument("--layer", default="0", metavar="L", help="with --real-qkv: the layer, from 0 (default 0)")


# --- parsing ------------------------------------------------------------------------------


def parse_ns(text: str) -> list[int]:
    """'256,512,1024' as given; '256,512,...,16384' continues the first two's ratio up to the last."""
    items = [s.strip() for s in str(text).split(",") if s.strip()]
    if not items:
        raise UserError("--n needs at least one sequence length")
    if "..." not in items:
        return [positive_int(s, "sequence length") for s in items]
    if items.count("...") > 1 or items.index("...") != len(items) - 2 or len(items) < 3:
        raise UserError("--n with '...' needs the form FIRST[,SECOND],...,LAST, e.g. 256,512,...,16384")
    head = [positive_int(s, "sequence length") for s in items[:-2]]
    last = positive_int(items[-1], "sequence length")
    ratio = head[-1] / head[-2] if len(head) >= 2 else 2.0
    if len(head) >= 2 and (ratio <= 1 or head[-1] % head[-2]):
        raise UserError(f"--n: '...' needs a whole growth ratio above 1, got {head[-2]} then {head[-1]}")
    ns = list(head)
    while ns[-1] * ratio <= last:
        ns.append(int(ns[-1] * ratio))
    if ns[-1] != last and last > ns[-1]:
        ns.append(last)
    return ns


def parse_impls(text: str) -> list[str]:
    items = [s.strip().lower() for s in str(text).split(",") if s.strip()]
    if not items:
        raise UserError("--impl needs at least one variant")
    for s in items:
        try:
            get_variant(s)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return list(dict.fromkeys(items))


def parse_budget_gb(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        gb = float(text)
    except ValueError:
        raise UserError(f"--budget-gb must be a positive number of gigabytes, got {text!r}") from None
    if not (gb > 0 and math.isfinite(gb)):
        raise UserError(f"--budget-gb must be a positive number of gigabytes, got {text!r}")
    return int(gb * 1e9)


def parse_blocks(text: str) -> tuple[int | None, int]:
    """'QB' (both tiles) or 'QB,KB'; QB may be 'auto' (None), and then KB defaults to 256."""
    parts = [s.strip() for s in str(text).split(",") if s.strip()]
    if len(parts) not in (1, 2):
        raise UserError(f"--block takes QB or QB,KB, got {text!r}")
    qb = None if parts[0].lower() == "auto" else positive_int(parts[0], "--block")
    if len(parts) == 1:
        return qb, 256 if qb is None else qb
    return qb, positive_int(parts[1], "--block")


def config_from_args(args: argparse.Namespace):
    """A validated SweepConfig from the parsed arguments; bad input raises UserError."""
    from attn_explorer.core.device import pick_device, pick_dtype
    from attn_explorer.cost.config import SweepConfig

    ns = parse_ns(args.n)
    impls = parse_impls(args.impl)
    q_block, k_block = parse_blocks(args.block)
    try:
        device = pick_device(args.device)
        pick_dtype(args.dtype, device)
        if args.dtype.lower() not in ("float32", "fp32") and device.type == "cpu":  # 16-bit timings on a CPU mislead
            raise ValueError(f"{args.dtype} needs a GPU for timings; on the CPU the cost lab measures float32")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return SweepConfig(
        ns=ns, impls=impls, heads=positive_int(args.heads, "--heads"), d_k=positive_int(args.dk, "--dk"),
        batch=positive_int(args.batch, "--batch"), dtype=args.dtype.lower(), device=str(device),
        causal=bool(args.causal), repeats=positive_int(args.repeats, "--repeats"),
        window=positive_int(args.window, "--window"), q_block=q_block, k_block=k_block,
        budget_bytes=parse_budget_gb(args.budget_gb),
    )


# --- output -------------------------------------------------------------------------------

HEADER = f"{'n':>7}  {'variant':<8} {'median ms':>10} {'min–max ms':>17} {'peak MB':>10} {'rel. error':>11}  note"


def format_row(r: dict) -> str:
    ms = f"{r['ms']:.2f}" if r.get("ms") is not None else "-"
    spread = f"{r['ms_min']:.2f}–{r['ms_max']:.2f}" if r.get("ms_min") is not None else "-"
    mb = f"{r['peak_bytes'] / 1e6:.2f}" if r.get("peak_bytes") is not None else "-"
    err = f"{r['rel_error']:.2e}" if r.get("rel_error") is not None else "-"
    note = r.get("message") or ""
    if r.get("reference") and r["reference"] != "naive":
        note = (note + " " if note else "") + f"(error vs {r['reference']})"
    if r.get("status") == "failed" and not note.startswith("failed"):
        note = f"failed: {note}"
    return f"{r['n']:>7}  {r['impl']:<8} {ms:>10} {spread:>17} {mb:>10} {err:>11}  {note}".rstrip()


def slope_table(records: list[dict]) -> tuple[list[str], dict[str, Any]]:
    """Lines of the slope table and the same as plain data for the JSON."""
    from attn_explorer.cost.fit import FIT_RULE, slopes

    time_fit, mem_fit = slopes(records, "ms"), slopes(records, "peak_bytes")
    lines = [f"{'variant':<8} {'time slope':>10} {'memory slope':>13}  time fitted over"]
    data: dict[str, Any] = {}
    for impl in dict.fromkeys(r["impl"] for r in records):
        t, m = time_fit.get(impl), mem_fit.get(impl)
        span = (f"n = {t.n_min}..{t.n_max} ({t.points} points)" if t else
                "no slope: the time grew less than 4× over the sizes measured (overhead dominates)")
        lines.append(f"{impl:<8} {(f'{t.p:.2f}' if t else '-'):>10} {(f'{m.p:.2f}' if m else '-'):>13}  {span}")
        data[impl] = {"time_slope": t.p if t else None, "memory_slope": m.p if m else None,
                      "time_n_min": t.n_min if t else None, "time_n_max": t.n_max if t else None,
                      "memory_n_min": m.n_min if m else None, "memory_n_max": m.n_max if m else None}
    lines.append(f"({FIT_RULE})")
    return lines, data


def write_json_atomic(path: str | os.PathLike, payload: Any) -> None:
    """Write JSON next to its destination, then rename over it: a reader never sees half a file."""
    from attn_explorer.files import atomic_write

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2, allow_nan=False, default=_json_default)
            f.write("\n")

    try:
        atomic_write(path, write)
    except UserError as e:
        raise UserError(f"--json: {e}") from None


def _json_default(obj: Any) -> Any:
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _finite(x: Any) -> Any:
    """JSON has no NaN or infinity: write null instead."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def run(args: argparse.Namespace) -> int:
    if args.real_qkv:
        return run_real_qkv(args)
    cfg = config_from_args(args)
    if args.json is not None and not Path(args.json).parent.is_dir():
        raise UserError(f"--json: folder {str(Path(args.json).parent)!r} does not exist")

    import dataclasses

    import torch

    from attn_explorer.cost.fit import noise_verdict
    from attn_explorer.cost.measure import Measurement, sweep
    from attn_explorer.cost.memory import default_budget, human_bytes

    budget = cfg.budget_bytes if cfg.budget_bytes is not None else default_budget(torch.device(cfg.device))
    print(f"# {cfg.batch}×{cfg.heads} heads, d_k = {cfg.d_k}, {cfg.dtype} on {cfg.device}"
          f"{', causal' if cfg.causal else ''}; median of {cfg.repeats} timed runs after a warm-up, interleaved "
          f"across the variants; memory budget {human_bytes(budget)}")
    print(f"# {ERROR_NOTE}")
    print(HEADER)
    records: list[dict] = []
    for item in sweep(cfg):
        if isinstance(item, Measurement):
            d = item.to_dict()
            records.append(d)
            print(format_row(d), flush=True)
    lines, slopes_data = slope_table(records)
    print()
    print("\n".join(lines))
    verdict = noise_verdict(records)
    if verdict.noisy:
        print(f"warning: {verdict.line()}", file=sys.stderr)
    if args.json is not None:
        payload = {
            "config": dataclasses.asdict(cfg) | {"budget_bytes": budget},
            "environment": {"torch": torch.__version__, "python": platform.python_version(),
                            "machine": platform.machine(), "threads": torch.get_num_threads()},
            "results": records,
            "slopes": slopes_data,
            "noise": list(verdict.reasons),
        }
        write_json_atomic(args.json, _finite(payload))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def run_real_qkv(args: argparse.Namespace) -> int:
    """The variants on one layer's own q, k, v of a model, for one text, next to random q, k, v."""
    impls = parse_impls(args.impl)
    window = positive_int(args.window, "--window")
    repeats = positive_int(args.repeats, "--repeats")
    layer = int(args.layer) if str(args.layer).strip().lstrip("-").isdigit() else None
    if layer is None or layer < 0:
        raise UserError(f"--layer must be a layer number from 0, got {args.layer!r}")
    if args.json is not None and not Path(args.json).parent.is_dir():
        raise UserError(f"--json: folder {str(Path(args.json).parent)!r} does not exist")
    import attn_explorer as ax
    from attn_explorer.api.probe import layer_qkv
    from attn_explorer.cost.real import compare_on_qkv, window_for

    model = ax.load_model(args.model, device=args.device)
    if model.info.modality != "text":
        raise UserError(f"--real-qkv takes a text model; {model.info.name} reads images")
    if layer >= model.info.num_layers:
        raise UserError(f"layer {layer} does not exist; {model.info.name} has layers 0..{model.info.num_layers - 1}")
    text = args.text if args.text is not None else "The animal didn't cross the street because it was too tired."
    if not text.strip():
        raise UserError("--text is empty; give some words")
    q, k, v = layer_qkv(model, text, layer)  # (H, N, d_k)
    H, N, d_k = q.shape
    rows = compare_on_qkv(q, k, v, impls, window=window, causal=bool(model.info.causal), repeats=repeats)
    w = window_for(N, window)
    print(f"# {model.info.name}, layer {layer}: {H} heads × {N} tokens × d_k = {d_k}; window w = {w}"
          + ("" if w == window else f" (--window {window} covers all {N} tokens, so a quarter of them is used)"))
    print(f"# {ERROR_NOTE}; random: N(0, 1) q, k, v of the same shape")
    print(f"{'variant':<8} {'error on model q,k,v':>21} {'error on random':>16} {'median ms':>10}")
    fmt = (lambda e: "reference" if e is None else f"{e:.2e}")
    for r in rows:
        print(f"{r.impl:<8} {fmt(r.rel_error):>21} {fmt(r.random_rel_error):>16} {r.ms:>10.3f}")
    if args.json is not None:
        write_json_atomic(args.json, _finite({"model": model.info.name, "layer": layer, "text": text, "heads": H,
                                              "n": N, "d_k": d_k, "window": w, "rows": [r.to_dict() for r in rows]}))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
