"""`ablate`: switch off each head in turn and save the L×H grid of effects (.json or .npz, written atomically).

The effect is measured in the form that fits the model (analysis.interventions): a decoder's next-token
log-probability of --target (or the logit difference against --foil), an encoder's sentence-embedding
similarity with the clean run, a classifier's class probability. Bad input is one line, exit 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write, check_output

FORMATS = (".json", ".npz")
TOP = 10  # heads printed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a built-in name (smollm2-135m, minilm, tiny-vit-digits...), a folder "
                   "or a hub id")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the input text")
    src.add_argument("--image", help="the input image (image models)")
    p.add_argument("--target", default=None, help="decoders: the next token to measure (one token, e.g. ' Mary'; "
                   "default: the clean run's most likely one); classifiers: the class (default: the top class)")
    p.add_argument("--foil", default=None, help="decoders: measure logit(target) - logit(foil) instead")
    p.add_argument("--how", default="zero", choices=("zero", "mean"), help="zero (default) or mean: each head's "
                   "output set to 0, or to its mean over this input's positions")
    p.add_argument("--out", required=True, help="where to save the grid: .json or .npz")
    add_common(p)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", default=None, help="copies per forward pass (default: what memory allows, at most 96)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")


def output_path(out: str) -> Path:
    """--out checked before any work: a known suffix, a folder that exists."""
    path = Path(out)
    if path.suffix.lower() not in FORMATS:
        raise UserError(f"--out must end in {', '.join(FORMATS)}; got {path.name!r}")
    return check_output(path)


def batch_value(batch) -> int | None:
    from attn_explorer.validate import positive_int

    return None if batch is None else positive_int(batch, "--batch")


def save_scan(scan, model_name: str, out: Path) -> Path:
    """The scan as .json (plain lists) or .npz (arrays; strings as NumPy unicode), atomically."""
    if out.suffix.lower() == ".npz":
        arrays = {**scan.to_arrays(), "model": np.asarray(model_name, dtype=np.str_)}

        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez_compressed(f, **arrays)
    else:
        data = {"model": model_name, **scan.to_dict()}

        def write(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f)

    return atomic_write(out, write)


def print_ranked(scan, columns: str = "H") -> None:
    """The cells with the largest effect, one line each, on stdout."""
    print(f"{scan.metric}: clean {scan.clean:.4f}" + ("" if scan.corrupt is None else f", corrupt {scan.corrupt:.4f}"))
    print(f"largest {scan.effect_label}:")
    for row, col, e in scan.ranked(TOP):
        where = f"L{row} {columns}{col}" if columns == "H" else f"L{row} @{col} {scan.tokens[col]!r}"
        print(f"  {where}: {e:+.4f} (metric {scan.values[row, col]:.4f})")


def load(args):
    from attn_explorer.api.load import load_model

    return load_model(args.model, device=args.device, dtype=args.dtype)


def run(args: argparse.Namespace) -> int:
    out = output_path(args.out)
    batch = batch_value(args.batch)
    from attn_explorer.analysis.interventions import ablation_scan

    model = load(args)
    x = args.text if args.text is not None else args.image
    scan = ablation_scan(model, x, how=args.how, batch=batch, target=args.target, foil=args.foil)
    print_ranked(scan)
    save_scan(scan, model.info.name, out)
    print(f"wrote {out}: {scan.values.shape[0]} layers x {scan.values.shape[1]} heads in {scan.passes} forward "
          "passes", file=sys.stderr)
    return 0
