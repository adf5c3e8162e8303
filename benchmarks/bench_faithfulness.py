"""How faithful each relevance method is on the tiny ViT, and what gradient relevance costs on SmolLM2.

1. Deletion (tiny-vit-digits, the 359 held-out digits of the trainer's split, seed 0). For every image the
   16 patches are deleted most-relevant-first, one more at each step, and the probability of the class the
   model predicted on the whole image is read after each step (17 points, 0 to 16 patches deleted). The
   area under that curve (x: the share of patches deleted, 0..1) is lower when the ranking found the patches
   the model needs first: lower is more faithful. A deleted patch is set to black, pixel value 0 (the
   digits' background), before the (x - 0.5) / 0.5 normalisation; a second column sets it to the held-out
   images' mean instead. Methods: a random order (the mean of 5 seeded orders per image), the last layer's
   raw [CLS] attention (mean over heads), attention rollout, gradient rollout (Chefer et al. 2021) and the
   AttnLRP subset of analysis.relevance (signed: most positive first). Each explains the predicted class.
2. Time (SmolLM2-135M, 32 tokens): gradient relevance (one forward pass with autograd and one backward
   pass) against one forward pass of the same model in the same run (Model.run, which returns every map;
   and the bare module under inference_mode), medians of --runs after a warm-up.

    python benchmarks/bench_faithfulness.py [--runs 5] [--threads N] [--skip-time] [--out docs/bench_faithfulness.md]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis.relevance import class_logit, explain, next_token_score, token_relevance  # noqa: E402
from attn_explorer.lessons.digits import load_digits  # noqa: E402
from attn_explorer.lessons.train_vit import normalise  # noqa: E402

METHODS = ("random", "attention", "rollout", "gradient_rollout", "attnlrp")
TITLES = {"random": "random order (mean of 5)", "attention": "raw [CLS] attention, last layer, mean over heads",
          "rollout": "attention rollout (Abnar & Zuidema)", "gradient_rollout": "gradient rollout (Chefer et al. 2021)",
          "attnlrp": "relevance: AttnLRP subset"}
TEXT = ("The capital of France is Paris, the capital of Italy is Rome, the capital of Spain is Madrid, and "
        "the capital of Germany, a country in the middle of Europe with many large cities, is")


# ---- 1. deletion -----------------------------------------------------------------------------------------

def patch_orders(module, x: np.ndarray, pred: torch.Tensor, method: str, seed: int = 0) -> np.ndarray:
    """(K, B, P) patch indices, most relevant first (K = 5 random orders for "random", else 1)."""
    B, P = len(x), module.cfg.native_grid ** 2
    if method == "random":
        rng = np.random.default_rng(seed)
        return np.stack([np.stack([rng.permutation(P) for _ in range(B)]) for _ in range(5)])
    E = module.cfg.num_extra_tokens
    rel, _ = token_relevance(module, {"pixels": normalise(torch.from_numpy(x))}, class_logit(pred), method, [0])
    return np.argsort(-rel[:, E:], axis=1, kind="stable")[None]


def deleted(x: np.ndarray, order: np.ndarray, k: int, patch: int, fill: np.ndarray) -> np.ndarray:
    """Images x (B, 3, S, S) with each image's first k patches of `order` (B, P) replaced by fill (3, S, S)."""
    B, P = order.shape
    g = x.shape[-1] // patch
    gone = np.zeros((B, P), dtype=bool)
    np.put_along_axis(gone, order[:, :k], True, axis=1)
    mask = np.repeat(np.repeat(gone.reshape(B, g, g), patch, 1), patch, 2)[:, None]  # (B, 1, S, S)
    return np.where(mask, fill[None], x).astype(np.float32)


@torch.no_grad()
def class_probs(module, x: np.ndarray, cls: np.ndarray) -> np.ndarray:
    p = torch.softmax(module(pixels=normalise(torch.from_numpy(x))).logits, -1)
    return p[torch.arange(len(x)), torch.from_numpy(cls)].numpy()


def deletion_auc(module, x: np.ndarray, orders: np.ndarray, cls: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """(B,) area under each image's class-probability curve as patches go, averaged over the orders."""
    P, patch = orders.shape[-1], module.cfg.patch_size
    aucs = []
    for order in orders:
        curve = np.stack([class_probs(module, deleted(x, order, k, patch, fill), cls) for k in range(P + 1)], 1)
        aucs.append(np.trapezoid(curve, dx=1.0 / P, axis=1) if hasattr(np, "trapezoid") else
                    np.trapz(curve, dx=1.0 / P, axis=1))
    return np.mean(aucs, axis=0)


def faithfulness_table() -> list[str]:
    m = ax.load_model("tiny-vit-digits")
    module = m.module
    d = load_digits(0)
    x, y = d.x_test, d.y_test
    with torch.no_grad():
        pred = module(pixels=normalise(torch.from_numpy(x))).logits.argmax(-1)
    cls = pred.numpy()
    fills = {"black (0)": np.zeros(x.shape[1:], np.float32), "held-out mean": x.mean(0)}
    results = {}
    for method in METHODS:
        orders = patch_orders(module, x, pred, method)
        results[method] = {name: deletion_auc(module, x, orders, cls, fill) for name, fill in fills.items()}
    start = class_probs(module, x, cls).mean()
    rows = [f"tiny-vit-digits: {len(y)} held-out digits (seed 0 split), accuracy {(cls == y).mean():.1%}; mean "
            f"probability of the predicted class on the whole image {start:.3f}. Patches deleted most-relevant-first, "
            "16 steps; AUC of the predicted class's probability over the share deleted (0..1). Lower is more "
            "faithful. ± is the standard error over images.", "",
            "| order of deletion | AUC, patch → black (0) | AUC, patch → held-out mean | images where it beats random (black) |",
            "|---|---|---|---|"]
    best = {name: min(METHODS, key=lambda k: results[k][name].mean()) for name in fills}  # bold: lowest per column
    for method in METHODS:
        r = results[method]
        cells = []
        for name in fills:
            a = r[name]
            mark = "**" if method == best[name] else ""
            cells.append(f"{mark}{a.mean():.4f}{mark} ± {a.std(ddof=1) / np.sqrt(len(a)):.4f}")
        beats = "—" if method == "random" else f"{(r['black (0)'] < results['random']['black (0)']).mean():.1%}"
        rows.append(f"| {TITLES[method]} | {cells[0]} | {cells[1]} | {beats} |")
    rows.append("")
    for name in fills:
        ranked = sorted(METHODS, key=lambda k: results[k][name].mean())
        a, b = results[ranked[0]][name], results[ranked[1]][name]
        diff = a - b
        se = diff.std(ddof=1) / np.sqrt(len(diff))
        rows.append(f"- {name}: lowest AUC **{TITLES[ranked[0]]}**; next {TITLES[ranked[1]]}, paired difference "
                    f"{diff.mean():+.4f} ± {se:.4f}" + (" (within two standard errors: a tie)" if abs(diff.mean()) < 2 * se
                                                         else ""))
    return rows


# ---- 2. time ---------------------------------------------------------------------------------------------

def interleaved(cases: list, runs: int) -> list[tuple[str, float, float, float]]:
    """(name, median ms, min ms, median ratio to cases[1]) per case. Each round times every case once, in turn,
    so a busy machine slows all of them alike; the ratio is taken within each round, then its median."""
    for _, fn in cases:
        fn()  # warm-up
    ms = [[] for _ in cases]
    for _ in range(runs):
        for i, (_, fn) in enumerate(cases):
            t0 = time.perf_counter()
            fn()
            ms[i].append((time.perf_counter() - t0) * 1000)
    ref = ms[1]
    return [(name, statistics.median(t), min(t), statistics.median(a / b for a, b in zip(t, ref)))
            for (name, _), t in zip(cases, ms)]


def time_table(runs: int) -> list[str]:
    m = ax.load_model("smollm2-135m")
    prep = m.prepare(TEXT, max_tokens=32)
    n = len(prep.tokens)
    module = m.module
    with torch.inference_mode():  # the most likely next token: what the page explains by default
        tid = int(module.logits(module(**prep.inputs).hidden[0, -1]).argmax())

    def bare():
        with torch.inference_mode():
            module(**prep.inputs)

    cases = [
        ("one forward pass, bare module (inference_mode, fused attention)", bare),
        ("one forward pass, Model.run (every map returned)", lambda: m.run(TEXT, max_tokens=32)),
        ("gradient rollout: forward with autograd + backward (token_relevance)",
         lambda: token_relevance(module, prep.inputs, next_token_score(module, tid, True), "gradient_rollout", [n - 1])),
        ("AttnLRP subset: forward with autograd + backward (token_relevance)",
         lambda: token_relevance(module, prep.inputs, next_token_score(module, tid, False), "attnlrp", [n - 1])),
        ("gradient rollout as the page runs it (explain: tokenise, then the same relevance pass)",
         lambda: explain(m, TEXT, "gradient_rollout", max_tokens=32)),
    ]
    times = interleaved(cases, runs)
    rows = [f"SmolLM2-135M, {n} tokens, {torch.get_num_threads()} thread(s); median (min) of {runs} rounds after one "
            "warm-up, each round timing every case in turn; × = the median over rounds of the time / Model.run's "
            "time in the same round.", "",
            "| what | ms median (min) | × one forward (Model.run) |", "|---|---|---|"]
    rows += [f"| {name} | {med:.1f} ({lo:.1f}) | {ratio:.2f}× |" for name, med, lo, ratio in times]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip-time", action="store_true", help="only the faithfulness table")
    ap.add_argument("--skip-faithfulness", action="store_true", help="only the time table")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_faithfulness.md"))
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    lines = [f"# Relevance: faithfulness and cost ({datetime.date.today()}, {platform.machine()}, torch {torch.__version__})"]
    if not a.skip_faithfulness:
        lines += ["", "## Deletion on tiny-vit-digits", ""] + faithfulness_table()
    if not a.skip_time:
        lines += ["", "## Gradient relevance against one forward pass", ""] + time_table(a.runs)
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(a.out)
    if out.parent.is_dir():
        out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
