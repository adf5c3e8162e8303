"""The corpus view's throughput: sentences of about 20 tokens through MiniLM, gathered (every head's
statistics, two chosen heads' queries and keys) against the same forward passes alone, in the same run.

    python benchmarks/bench_corpus.py [--sentences 1000] [--runs 3] [--threads 2]

"forward alone" tokenises each sentence and runs the module with no attention returned; "forward with
maps" returns the maps too (what any attention view pays). The target is gathered <= 1.5x forward alone.
Medians of --runs passes over the corpus; only the ratios carry across machines.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis.corpus import joint_embedding, run_corpus  # noqa: E402

WORDS = ("the animal did not cross the street because it was too tired and the cat sat on a warm mat while "
         "people in paris walked to the river to see boats go by under old bridges at night").split()


def sentences(n: int, length: int = 18) -> list[str]:
    """n different sentences of `length` words (about 20 tokens with [CLS] and [SEP])."""
    out = []
    for i in range(n):
        words = [WORDS[(i * 7 + j * (i % 5 + 1)) % len(WORDS)] for j in range(length)]
        out.append(" ".join(words).capitalize() + ".")
    return out


def timed(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = ax.load_model("minilm")
    corpus = sentences(a.sentences)
    tokens = sum(len(m.prepare(s).tokens) for s in corpus)

    def alone(maps: bool):
        def go():
            for s in corpus:
                m._forward(m.prepare(s).inputs, output_attentions=maps)
        return go

    t_alone = timed(alone(False), a.runs)
    t_maps = timed(alone(True), a.runs)
    heads = [(2, 1), (5, 0)]
    t_gather = timed(lambda: run_corpus(m, corpus, heads), a.runs)
    c = run_corpus(m, corpus, heads)
    t_embed = timed(lambda: joint_embedding(c.points(2, 1)), a.runs)
    print(f"{a.sentences} sentences, {tokens:,} tokens ({tokens / a.sentences:.1f} a sentence), MiniLM, "
          f"{a.threads} threads, median of {a.runs}\n")
    print("| pass | s | sentences/s | × forward alone |")
    print("|---|---|---|---|")
    for name, t in (("forward alone (no maps)", t_alone), ("forward with maps", t_maps),
                    ("corpus gathered (stats of every head, q/k of 2 heads)", t_gather)):
        print(f"| {name} | {t:.2f} | {a.sentences / t:.0f} | {t / t_alone:.2f} |")
    print(f"\nPCA of one head's {2 * len(c.points(2, 1).q):,} query and key points: {t_embed * 1000:.1f} ms")


if __name__ == "__main__":
    main()
