"""`corpus`: run many sentences through a model and save what its heads do over all of them (.npz).

One sentence a line. For every head: each sentence's head statistics (entropy, sink share, distance,
previous/next-token share) and how strongly it fires; for the chosen heads (--heads 5:0,2:1) their tokens'
query and key vectors (subsampled to --max-points tokens a head) and their joint 2-D embedding (PCA,
or UMAP with --umap when umap-learn is installed). Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write, check_output, read_text_file
from attn_explorer.validate import dk_scale_value, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="minilm", help="a text model: built-in name, folder or hub id (default minilm)")
    p.add_argument("--text-file", required=True, help="UTF-8 file, one sentence a line (blank lines skipped)")
    p.add_argument("--out", required=True, help="output file ending in .npz")
    p.add_argument("--heads", default=None, help="heads whose queries and keys to keep, layer:head comma-separated "
                   "(default: head 0 of the last layer)")
    p.add_argument("--max-points", default="4000", help="tokens kept per chosen head, a uniform sample (default 4000)")
    p.add_argument("--umap", action="store_true", help="embed with UMAP instead of PCA (needs umap-learn)")
    p.add_argument("--dk-scale", default="1.0", help="multiply 1/sqrt(d_k) by this (default 1)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args) -> int:
    from attn_explorer.analysis.corpus import corpus_arrays, gather, parse_heads, read_sentences, umap_available
    from attn_explorer.api.load import load_model

    out = check_output(args.out)
    if out.suffix.lower() != ".npz":
        raise UserError(f"--out must end in .npz; got {out.name!r}")
    if args.umap and not umap_available():
        raise UserError("--umap needs umap-learn (pip install umap-learn); without --umap PCA is used")
    max_points = positive_int(args.max_points, "--max-points")
    dk = dk_scale_value(args.dk_scale, "--dk-scale")
    sentences = read_sentences(read_text_file(args.text_file))
    model = load_model(args.model, device=args.device)
    if model.info.modality != "text":
        raise UserError(f"{model.info.name} reads images; the corpus takes sentences of text")
    heads = parse_heads(args.heads, model.info.num_layers, model.info.num_heads)
    corpus = None
    for item in gather(model, sentences, heads, max_points, dk):
        if isinstance(item, tuple):
            done, total = item
            if not args.quiet and (done == total or done % 50 == 0):
                print(f"\r{done:,} / {total:,} sentences", end="" if done < total else "\n", file=sys.stderr)
        else:
            corpus = item
    arrays = corpus_arrays(corpus, "umap" if args.umap else "pca")

    def write(tmp):
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)

    atomic_write(out, write)
    print(f"wrote {out}: {corpus.num_sentences:,} sentences, {corpus.tokens_seen:,} tokens, "
          f"{len(corpus.heads)} head(s) embedded")
    return 0
