"""`patch`: activation patching clean -> corrupt. Run the corrupt text with one head's output (or, with
--per position, every head of one layer at one position) taken from the clean run, for every cell, and save
the grid (.json or .npz, atomically). --heads patches the heads given together instead, once. The texts
must have the same number of tokens. Bad input is one line, exit 2."""
from __future__ import annotations

import argparse
import json
import sys

from attn_explorer.cli.ablate import add_common, batch_value, load, output_path, print_ranked, save_scan
from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a decoder (smollm2-135m, gemma3-270m, a folder...) or any model")
    p.add_argument("--clean", required=True, help="the clean text")
    p.add_argument("--corrupt", required=True, help="the corrupt text, with as many tokens (e.g. two names swapped)")
    p.add_argument("--target", default=None, help="decoders: the next token to measure, one token (e.g. ' Mary')")
    p.add_argument("--foil", default=None, help="decoders: measure logit(target) - logit(foil) (e.g. ' John')")
    p.add_argument("--per", default="head", choices=("head", "position"), help="head (default): one head at every "
                   "position per cell; position: every head of a layer at one position per cell")
    p.add_argument("--heads", default=None, help="patch only these heads, together, once: 'L:H,L:H' (e.g. '9:6,10:0')")
    p.add_argument("--positions", default=None, help="with --heads: only these token positions, e.g. '3,11'")
    p.add_argument("--out", required=True, help="where to save the grid: .json or .npz")
    add_common(p)


def parse_heads(text: str) -> list[tuple[int, int]]:
    heads = []
    for part in text.split(","):
        try:
            layer, head = part.strip().split(":")
            heads.append((int(layer), int(head)))
        except ValueError:
            raise UserError(f"--heads takes 'layer:head' pairs separated by commas, e.g. '9:6,10:0'; got {part!r}") \
                from None
    return heads


def parse_positions(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(p) for p in text.split(",")]
    except ValueError:
        raise UserError(f"--positions takes token indices separated by commas, e.g. '3,11'; got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    out = output_path(args.out)
    batch = batch_value(args.batch)
    heads = None if args.heads is None else parse_heads(args.heads)
    positions = parse_positions(args.positions)
    if positions is not None and heads is None:
        raise UserError("--positions goes with --heads (the scans cover every position)")
    if heads is not None and out.suffix.lower() == ".npz":
        raise UserError("--heads saves one result: use --out ending in .json")
    from attn_explorer.analysis.interventions import patch, patching_scan

    model = load(args)
    if heads is not None:
        p = patch(model, args.clean, args.corrupt, heads=heads, positions=positions, target=args.target,
                  foil=args.foil)
        data = {"model": model.info.name, "metric": p.metric, "heads": [list(h) for h in heads],
                "positions": positions, "clean": p.clean, "corrupt": p.corrupt, "patched": p.patched,
                "restored": p.restored}
        print(f"{p.metric}: clean {p.clean:.4f}, corrupt {p.corrupt:.4f}, patched {p.patched:.4f} "
              f"({p.restored:.1%} of the gap restored)")

        def write(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f)

        atomic_write(out, write)
        print(f"wrote {out}", file=sys.stderr)
        return 0
    scan = patching_scan(model, args.clean, args.corrupt, per=args.per, batch=batch, target=args.target,
                         foil=args.foil)
    print_ranked(scan, "H" if args.per == "head" else "@")
    save_scan(scan, model.info.name, out)
    print(f"wrote {out}: {scan.values.shape[0]} layers x {scan.values.shape[1]} "
          f"{'heads' if args.per == 'head' else 'positions'} in {scan.passes} forward passes", file=sys.stderr)
    return 0
