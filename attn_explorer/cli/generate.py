"""`generate`: let a decoder write after a prompt, printing the text as it comes, and save every new
token's attention and next-token probabilities (.npz or .json, written atomically)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write, check_output
from attn_explorer.validate import positive_int

FORMATS = (".npz", ".json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="a decoder: smollm2-135m (default), a Llama or "
                   "GPT-2 folder, or a hub id")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template (one user turn)")
    p.add_argument("--max-new-tokens", default="32", help="at most this many new tokens (default 32)")
    p.add_argument("--temperature", default="0", help="0 = greedy (default); above 0 samples from "
                   "softmax(logits / T)")
    p.add_argument("--top-k", default=None, help="sample only from the K most likely tokens; also how many "
                   "probabilities each step records (default 10)")
    p.add_argument("--seed", default=None, help="seed for sampling (repeatable runs)")
    p.add_argument("--out", default=None, help="save tokens, text, attention rows and probabilities: .npz or .json")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16 (the CPU too)")


def record(gen, steps: list) -> dict:
    """What a generation saves: tokens and text, and per step the attention row (padded to the longest,
    `lengths` says how much of each is real) and the most likely next tokens."""
    S = len(steps)
    L, H = steps[0].attention.shape[:2] if steps else (0, 0)
    width = max((s.attention.shape[-1] for s in steps), default=0)
    att = np.zeros((S, L, H, width), dtype=np.float32)
    for i, s in enumerate(steps):
        att[i, :, :, : s.attention.shape[-1]] = s.attention
    K = max((len(s.top_ids) for s in steps), default=0)
    return {
        "model": gen.model.info.name,
        "prompt": gen.prompt_text,
        "prompt_ids": np.asarray(gen.prompt_ids, dtype=np.int64),
        "prompt_tokens": np.asarray(gen.prompt_tokens, dtype=np.str_),
        "token_ids": np.asarray([s.token_id for s in steps], dtype=np.int64),
        "tokens": np.asarray([s.token for s in steps], dtype=np.str_),
        "text": gen.text,
        "temperature": float(gen.temperature),
        "attentions": att,  # (S, L, H, width): step i's row over its first lengths[i] tokens
        "lengths": np.asarray([s.attention.shape[-1] for s in steps], dtype=np.int64),
        "top_ids": np.asarray([s.top_ids for s in steps], dtype=np.int64).reshape(S, K),
        "top_tokens": np.asarray([s.top_tokens for s in steps], dtype=np.str_).reshape(S, K),
        "top_probs": np.asarray([s.top_probs for s in steps], dtype=np.float32).reshape(S, K),
        "step_ms": np.asarray([s.ms for s in steps], dtype=np.float64),
    }


def save_generation(gen, steps: list, out: str | Path) -> Path:
    out = Path(out)
    d = record(gen, steps)
    if out.suffix.lower() == ".npz":
        arrays = {k: np.asarray(v, dtype=np.str_) if isinstance(v, str) else np.asarray(v) for k, v in d.items()}

        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez_compressed(f, **arrays)
    else:
        d["attentions"] = [s.attention.tolist() for s in steps]  # ragged: step i has lengths[i] keys
        plain = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in d.items()}

        def write(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(plain, f)

    return atomic_write(out, write)


def run(args: argparse.Namespace) -> int:
    max_new = positive_int(args.max_new_tokens, "--max-new-tokens")
    top_k = None if args.top_k is None else positive_int(args.top_k, "--top-k")
    if args.out is not None:
        if Path(args.out).suffix.lower() not in FORMATS:
            raise UserError(f"--out must end in {', '.join(FORMATS)}; got {Path(args.out).name!r}")
        check_output(args.out)  # before the model loads
    from attn_explorer.api.generate import seed_value, temperature_value
    from attn_explorer.api.load import load_model

    temperature = temperature_value(args.temperature)  # all checked before the model loads
    seed = None if args.seed is None else seed_value(args.seed)
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    gen = model.generate(args.prompt, max_new_tokens=max_new, temperature=temperature, top_k=top_k,
                         chat=args.chat, seed=seed)
    steps = []
    try:
        for step in gen:
            steps.append(step)
            sys.stdout.write(step.text)
            sys.stdout.flush()
    finally:
        sys.stdout.write("\n")
        sys.stdout.flush()
    if args.out is not None:
        save_generation(gen, steps, args.out)
        print(f"wrote {args.out}: {len(steps)} tokens, attention of {gen.model.info.num_layers} layers x "
              f"{gen.model.info.num_heads} heads per step", file=sys.stderr)
    return 0
