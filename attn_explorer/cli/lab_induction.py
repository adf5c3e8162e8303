"""`induction-check`: does switching off the top induction heads raise the loss on repeated random tokens more
than switching off as many random heads? (analysis.lab.induction_ablation). --scores: the .npz of
`induction` (its `induction` array) or of `atlas` (its `metric_induction`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from attn_explorer.cli.induction import random_token_options
from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write, check_output
from attn_explorer.validate import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="a decoder: built-in name, folder or hub id "
                   "(default smollm2-135m)")
    p.add_argument("--scores", required=True, help="an .npz from `induction` (or `atlas`) for this model")
    p.add_argument("--top", default="5", help="top induction heads switched off (default 5)")
    p.add_argument("--random-sets", default="5", help="random sets of as many heads (default 5)")
    p.add_argument("--seq-len", default="50", help="length of each random sequence, repeated once (default 50)")
    p.add_argument("--batches", default="4", help="random sequences (default 4)")
    p.add_argument("--seed", default="0", help="random seed (default 0)")
    p.add_argument("--out", default=None, help="also write the figures to this .json")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def read_scores(path: str) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--scores {p}: no such file")
    try:
        with np.load(p, allow_pickle=False) as z:
            key = next((k for k in ("induction", "metric_induction") if k in z.files), None)
            if key is None:
                raise UserError(f"--scores {p.name} holds no 'induction' or 'metric_induction' array")
            s = np.array(z[key])
    except UserError:
        raise
    except Exception as e:  # not an npz, truncated, pickled objects
        raise UserError(f"--scores {p.name} is not a readable .npz ({type(e).__name__})") from None
    if s.ndim != 2 or not np.issubdtype(s.dtype, np.number):
        raise UserError(f"--scores {p.name}: the induction scores must be a (layers, heads) array of numbers")
    return s


def run(args) -> int:
    from attn_explorer.analysis.lab import induction_ablation
    from attn_explorer.api.load import load_model

    out = check_output(args.out) if args.out else None
    if out is not None and out.suffix.lower() != ".json":
        raise UserError(f"--out must end in .json; got {out.name!r}")
    scores = read_scores(args.scores)
    top = positive_int(args.top, "--top")
    sets = positive_int(args.random_sets, "--random-sets")
    seq_len, batches, seed = random_token_options(args)
    model = load_model(args.model, device=args.device)

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            print(f"\r{done} / {total} conditions", end="" if done < total else "\n", file=sys.stderr, flush=True)

    c = induction_ablation(model, scores, top=top, random_sets=sets, seed=seed, seq_len=seq_len, batches=batches,
                           progress=progress)
    if out is not None:
        text = json.dumps(c.to_dict(), indent=1)
        atomic_write(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    print(c.summary())
    for heads, v in zip(c.random_heads, c.random):
        print(f"  random {', '.join(f'L{l}H{h}' for l, h in heads)}: {v:.4f}")
    return 0
