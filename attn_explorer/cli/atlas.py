"""`atlas`: stream a corpus through a model and save every head's corpus-wide metrics and top examples (.npz).

Documents: --text-file (repeatable), every .txt file of --folder, or, with neither, the bundled corpus
(ten public-domain Shakespeare plays, resources/corpus). One document a file, or with --per-line one a
line. The .npz holds metric_<name> (L, H) arrays (entropy, sink, distance, prev_token, duplicate, induction,
copy), the top examples and the texts they point at; the Atlas page opens it without the model.
"""
from __future__ import annotations

import argparse
import sys

from attn_explorer.analysis.atlas_build import MAX_FILE_BYTES, corpus_files, read_documents
from attn_explorer.errors import UserError
from attn_explorer.files import check_output, read_text_file
from attn_explorer.validate import positive_int

__all__ = ["add_arguments", "run", "corpus_files", "read_documents"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="a text model: built-in name, folder or hub id "
                   "(default smollm2-135m)")
    p.add_argument("--text-file", action="append", default=[], help="a UTF-8 text file; repeat for more")
    p.add_argument("--folder", action="append", default=[], help="a folder: each of its .txt files")
    p.add_argument("--per-line", action="store_true", help="one document a line (default: one a file)")
    p.add_argument("--out", required=True, help="output file ending in .npz")
    p.add_argument("--top-k", default="8", help="examples kept per head and per ranking (default 8)")
    p.add_argument("--max-tokens", default=None, help="stop after this many tokens of the corpus")
    p.add_argument("--context", default="1024", help="tokens per segment a document is cut into (default 1024)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args) -> int:
    from attn_explorer.analysis.atlas import ROLE_THRESHOLDS, role_text, suggest_roles
    from attn_explorer.analysis.atlas_build import build_atlas
    from attn_explorer.analysis.atlas_build import CONTEXT, check_model, count_tokens
    from attn_explorer.api.load import load_model

    out = check_output(args.out)
    if out.suffix.lower() != ".npz":
        raise UserError(f"--out must end in .npz; got {out.name!r}")
    top_k = positive_int(args.top_k, "--top-k")
    context = positive_int(args.context, "--context") if args.context is not None else CONTEXT
    max_tokens = positive_int(args.max_tokens, "--max-tokens") if args.max_tokens is not None else None
    paths = corpus_files(args.text_file, args.folder)
    for p in paths:  # every file readable and not empty before the model is loaded
        read_text_file(p, MAX_FILE_BYTES)
    model = load_model(args.model, device=args.device)
    check_model(model)
    total = count_tokens(model, read_documents(paths, args.per_line), min(context, model.info.max_positions))
    if max_tokens is not None:
        total = min(total, max_tokens)

    def progress(done: int, all_: int) -> None:
        if not args.quiet:
            print(f"\r{done:,} / {all_:,} tokens", end="", file=sys.stderr, flush=True)

    atlas = build_atlas(model, read_documents(paths, args.per_line), top_k=top_k, max_tokens=max_tokens,
                        progress=progress, context=context, total_tokens=total)
    if not args.quiet:
        print(file=sys.stderr)
    atlas.save(out)
    print(f"wrote {out}: {atlas.tokens:,} tokens, {atlas.documents:,} document(s), "
          f"{atlas.n_layers}×{atlas.n_heads} heads")
    roles = suggest_roles(atlas)
    print(f"roles ({role_text()}):")
    for role, (name, _) in ROLE_THRESHOLDS.items():
        if name not in atlas.metrics:
            continue
        heads = [(l, h) for (l, h), rs in roles.items() if role in rs]
        best = ", ".join(f"L{l}H{h} {v:.2f}" for l, h, v in atlas.ranked(name)[:3])
        print(f"  {role}: {len(heads)} head(s); highest {name}: {best}")
    if "copy" in atlas.notes and atlas.notes["copy"].startswith(model.info.name):
        print(f"note: {atlas.notes['copy']}")
    return 0
