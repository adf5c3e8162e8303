"""`lens`: the logit lens of a decoder on one text, and the direct logit attribution of a target token, saved as
JSON (written atomically). The final norm's scale is frozen from the final residual stream (see analysis.lens);
`--norm own` reads each layer with its own scale instead (the original logit lens)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write, check_output
from attn_explorer.validate import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="a decoder: smollm2-135m (default), gemma3-270m, a Llama "
                   "or GPT-2 folder, or a hub id")
    p.add_argument("--text", required=True, help="the text to read")
    p.add_argument("--out", required=True, help="where to save the lens and the attribution: .json")
    p.add_argument("--top-k", default="5", help="tokens per layer and position (default 5)")
    p.add_argument("--norm", default="frozen", choices=("frozen", "own"),
                   help="frozen (default): the final norm's scale from the final residual stream, as the "
                   "attribution uses; own: each layer's residual stream normalised with its own scale")
    p.add_argument("--target", default=None, help="the token whose logit is attributed (text such as ' Paris', "
                   "or an id); default: the model's own next token")
    p.add_argument("--position", default="-1", help="the position whose next token is attributed (default: the "
                   "last, -1)")
    p.add_argument("--max-tokens", default=None, help="keep only the first N tokens of the text")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")


def _position(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"--position must be a whole number (negative counts from the end), got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix.lower() != ".json":
        raise UserError(f"--out must end in .json; got {out.name!r}")
    check_output(out)  # before the model loads
    k = positive_int(args.top_k, "--top-k")
    pos = _position(args.position)
    run_kw = {} if args.max_tokens is None else {"max_tokens": positive_int(args.max_tokens, "--max-tokens")}
    from attn_explorer.analysis.lens import logit_attribution, logit_lens
    from attn_explorer.api.load import load_model

    model = load_model(args.model, device=args.device, dtype=args.dtype)
    lens = logit_lens(model, args.text, run_kw, k=k, norm=args.norm)
    dla = logit_attribution(model, args.text, run_kw, position=pos, target=args.target)
    record = {"lens": lens.to_json(), "attribution": dla.to_json()}

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)

    atomic_write(out, write)
    last = lens.top_tokens[-1][dla.position][0]
    print(f"wrote {out}: lens of {len(lens.row_names)} rows x {len(lens.tokens)} positions; at position "
          f"{dla.position} the model's next token is {last!r}; logit of {dla.target!r} = {dla.logit:.3f} "
          f"(pieces sum to {dla.total:.3f})", file=sys.stderr)
    return 0
