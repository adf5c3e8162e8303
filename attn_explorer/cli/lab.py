"""`retrieval`: retrieval heads by needle in a haystack (Wu et al. 2024; analysis.lab_retrieval).

For each length and depth, the needle sentence sits at that depth of filler (the bundled corpus, or
--filler-file) cut to that many tokens, then the question; the model answers greedily, reading one attention
row a step. Writes accuracy (lengths × depths), actual_tokens (the prompt tokens read: a few under each asked
length, as the filler is cut to fit), retrieval (L, H) scores, heads_ranked and the settings to an .npz (the
Lab page opens it: analysis.lab_results); with --random-sets N also the check (the top --top heads off
against N random sets of as many heads).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from attn_explorer.errors import UserError
from attn_explorer.files import check_output, read_text_file
from attn_explorer.validate import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    from attn_explorer.analysis.lab_retrieval import KEY_FACT, NEEDLE

    p.add_argument("--model", default="smollm2-135m", help="a decoder: built-in name, folder or hub id "
                   "(default smollm2-135m)")
    p.add_argument("--lengths", default="1024,2048", help="prompt lengths in tokens, comma-separated (default 1024,2048)")
    p.add_argument("--depths", default="0,0.5,1", help="needle depths from 0 (first) to 1 (last), comma-separated "
                   "(default 0,0.5,1)")
    p.add_argument("--out", required=True, help="output file ending in .npz")
    p.add_argument("--needle", default=NEEDLE, help=f"the needle sentence (default {NEEDLE!r})")
    p.add_argument("--question", default=None, help="the question after the haystack (default: asks for the magic "
                   "number, ending 'Answer: The special magic number for the blue lighthouse is')")
    p.add_argument("--answer", default=KEY_FACT, help=f"the key fact a right answer contains (default {KEY_FACT!r})")
    p.add_argument("--filler-file", default=None, help="a UTF-8 text file of filler (default: the bundled corpus)")
    p.add_argument("--max-new-tokens", default="8", help="tokens generated per answer (default 8)")
    p.add_argument("--top", default="5", help="retrieval heads switched off in the check (default 5)")
    p.add_argument("--random-sets", default="0", help="random head sets of the check; 0: no check (default 0)")
    p.add_argument("--seed", default="0", help="random seed of the check (default 0)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def number_list(text: str, name: str, kind=int) -> list:
    """'1024,4096' -> [1024, 4096]; one UserError line for anything else."""
    out = []
    for part in str(text).split(","):
        try:
            v = kind(part.strip())
        except ValueError:
            raise UserError(f"{name} must be comma-separated {'whole numbers' if kind is int else 'numbers'}, "
                            f"got {text!r}") from None
        if not np.isfinite(v):
            raise UserError(f"{name} must be finite numbers, got {text!r}")
        if v not in out:
            out.append(v)
    return out


def whole_number(value, name: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise UserError(f"{name} must be a whole number, got {value!r}") from None


def run(args) -> int:
    from attn_explorer.analysis.lab_results import save_results
    from attn_explorer.analysis.lab_retrieval import (QUESTION, bundled_filler, check_decoder, make_haystack,
                                                      retrieval_ablation, retrieval_scores)
    from attn_explorer.api.load import load_model
    from attn_explorer.validate import visible_text

    out = check_output(args.out)
    if out.suffix.lower() != ".npz":
        raise UserError(f"--out must end in .npz; got {out.name!r}")
    lengths = number_list(args.lengths, "--lengths")
    if any(n < 1 for n in lengths):
        raise UserError(f"--lengths must be positive, got {args.lengths!r}")
    depths = number_list(args.depths, "--depths", float)
    if any(not 0 <= d <= 1 for d in depths):
        raise UserError(f"--depths must be from 0 to 1, got {args.depths!r}")
    new = positive_int(args.max_new_tokens, "--max-new-tokens")
    top = positive_int(args.top, "--top")
    sets = whole_number(args.random_sets, "--random-sets")
    if sets < 0:
        raise UserError(f"--random-sets must be 0 or more, got {args.random_sets!r}")
    seed = whole_number(args.seed, "--seed")
    question = QUESTION if args.question is None else args.question
    for name, text in (("--needle", args.needle), ("--question", question), ("--answer", args.answer)):
        try:
            visible_text(text)
        except UserError as e:
            raise UserError(f"{name}: {e}") from None
    filler = read_text_file(args.filler_file) if args.filler_file else bundled_filler()
    model = load_model(args.model, device=args.device)
    check_decoder(model)
    longest = max(lengths) + new
    if longest > model.info.max_positions:
        raise UserError(f"--lengths {max(lengths)} + {new} new tokens exceed {model.info.name}'s "
                        f"{model.info.max_positions} positions")
    cases = [make_haystack(args.needle, question, filler, n, d, model.tokenizer, answer=args.answer)
             for n in lengths for d in depths]

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            print(f"\r{done} / {total}", end="" if done < total else "\n", file=sys.stderr, flush=True)

    r = retrieval_scores(model, cases, new, progress=progress)
    check = None
    if sets:
        check = retrieval_ablation(model, cases, r.scores, top=top, random_sets=sets, seed=seed,
                                   max_new_tokens=new, progress=progress)
    settings = {"needle": args.needle, "question": question, "answer": args.answer, "max_new_tokens": new,
                "filler": args.filler_file or "bundled corpus", "seed": seed}
    save_results(out, r, check, settings)
    print(f"wrote {out}: {len(cases)} haystack(s), {r.copied} answer token(s) copied from the needle")
    print("accuracy (rows: lengths, columns: depths " + ", ".join(f"{d:g}" for d in r.depths) + ")")
    for n, row, read in zip(r.lengths, r.accuracy, r.actual):
        lo, hi = int(read[read >= 0].min()), int(read.max())
        print(f"  {n:>6} (read {lo}{'' if lo == hi else f'-{hi}'}): " + " ".join(f"{v:.2f}" for v in row))
    print("top retrieval heads: " + (", ".join(f"L{l}H{h} {v:.2f}" for l, h, v in r.ranked()[:5])
                                     if r.copied else "none (no answer token was copied from the needle)"))
    if check is not None:
        print(check.summary())
    return 0
