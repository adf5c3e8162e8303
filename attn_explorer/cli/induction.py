"""`induction`: every head's induction score by repeated random tokens (a random sequence, then the same
again; the mean weight from each repeated token to the token after its first copy), saved as the (L, H)
array `induction` of an .npz. Prints the top heads.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write, check_output
from attn_explorer.validate import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="a text model: built-in name, folder or hub id "
                   "(default smollm2-135m)")
    p.add_argument("--out", required=True, help="output file ending in .npz")
    p.add_argument("--seq-len", default="50", help="length of the random sequence, repeated once (default 50)")
    p.add_argument("--batches", default="4", help="random sequences averaged over (default 4)")
    p.add_argument("--seed", default="0", help="random seed (default 0)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def random_token_options(args) -> tuple[int, int, int]:
    """--seq-len (at least 2), --batches and --seed of repeated random tokens, each checked in one line."""
    seq_len = positive_int(args.seq_len, "--seq-len")
    if seq_len < 2:
        raise UserError(f"--seq-len must be at least 2, got {seq_len}")
    batches = positive_int(args.batches, "--batches")
    try:
        seed = int(str(args.seed).strip())
    except ValueError:
        raise UserError(f"--seed must be a whole number, got {args.seed!r}") from None
    return seq_len, batches, seed


def run(args) -> int:
    from attn_explorer.analysis.atlas_build import check_model
    from attn_explorer.analysis.atlas_induction import induction_scores
    from attn_explorer.api.load import load_model

    out = check_output(args.out)
    if out.suffix.lower() != ".npz":
        raise UserError(f"--out must end in .npz; got {out.name!r}")
    seq_len, batches, seed = random_token_options(args)
    model = load_model(args.model, device=args.device)
    check_model(model)

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            print(f"\r{done} / {total} sequences", end="" if done < total else "\n", file=sys.stderr, flush=True)

    scores = induction_scores(model, seq_len=seq_len, batches=batches, seed=seed, progress=progress)
    arrays = scores.arrays()

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)

    atomic_write(out, write)
    cut = f" (cut from {seq_len} to fit the model's positions)" if scores.seq_len < seq_len else ""
    print(f"wrote {out}: induction scores of {scores.scores.shape[0]}×{scores.scores.shape[1]} heads, "
          f"{batches} random sequence(s) of {scores.seq_len} tokens repeated once{cut}")
    for l, h, v in scores.ranked()[:5]:
        print(f"  L{l}H{h} {v:.3f}")
    return 0
