"""Issue 26's targets on a tiny random Qwen3-VL (tests/api/vlm_tiny.py: 3 decoder layers × 6 heads, a 4-block
tower with DeepStack): a 256 × 256 picture (1,024 image tokens after the 2 × 2 merge) and a prompt of 64 text
tokens, run lazily (m.run(image, text=..., lazy=True): each decoder layer's q, k and row statistics kept).

- kept: what the lazy run holds (the store; the tower's maps are left out when larger than it) against what the
  decoder's dense maps take (L·H·N²·4), and the dense run's own maps (decoder and tower) for scale;
- overlay: one text token's attention over every layer and head (api.vlm.image_overlay(r, q): the row over the
  image tokens' span only, mapped back onto the picture), lazy and dense, the same run;
- lazy == dense: the two overlays' largest difference, and every head's map.

Medians of --repeats runs and --overlay-repeats overlays, the lazy and dense measures alternating (the machine may be shared). One markdown table.

    python benchmarks/bench_vlm.py [--repeats 5] [--overlay-repeats 25] [--threads 2] [--text-tokens 64] [--side 256]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def prompt_of(m, image, want: int) -> tuple[str, int]:
    """A prompt whose run has `want` text tokens (the image's expansion and its markers counted as text where
    they are not image tokens), or the nearest above."""
    n_image = len(m.prepare(image, text="").image_token_positions)

    def count(words):
        return len(m.prepare(image, text=" ".join(words) + " <image>").tokens) - n_image

    words: list[str] = []
    got = count(words)
    while got < want:
        for w in ("cat", "sat", "a", "the"):  # the first word that does not overshoot; else the first
            if count(words + [w]) <= want:
                break
        else:
            w = "cat"
        words.append(w)
        got = count(words)
    return " ".join(words) + " <image>", got


def human(n: int) -> str:
    from attn_explorer.budget import human_bytes

    return human_bytes(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs of each kind")
    ap.add_argument("--overlay-repeats", type=int, default=25, help="overlays of each kind")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text-tokens", type=int, default=64)
    ap.add_argument("--side", type=int, default=256, help="the picture's side in px (8 px an image token)")
    args = ap.parse_args()

    import numpy as np
    import torch

    import attn_explorer as ax
    from attn_explorer.api.vlm import image_overlay
    from tests.api.vlm_tiny import qwen3_vl_folder

    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp()) / "qwen3-vl-tiny"
    folder.mkdir()
    qwen3_vl_folder(folder, max_pixels=args.side * args.side, positions=4 * (args.side // 8) ** 2 + 4096)
    m = ax.load_model(str(folder), device="cpu")
    image = np.random.default_rng(0).integers(0, 256, (args.side, args.side, 3), dtype=np.uint8)
    text, n_text = prompt_of(m, image, args.text_tokens)

    lazy_ms, dense_ms, ov_lazy, ov_dense = [], [], [], []
    lazy = dense = None
    for _ in range(max(1, args.repeats)):  # alternate, so a busy moment falls on both
        t0 = time.perf_counter()
        lazy = m.run(image, text=text, lazy=True)
        lazy_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        dense = m.run(image, text=text, lazy=False)
        dense_ms.append((time.perf_counter() - t0) * 1000)
    q = lazy.num_tokens - 1  # the last text token
    for _ in range(max(1, args.overlay_repeats)):
        ov_lazy.append(_ms(lambda: image_overlay(lazy, q)))
        ov_dense.append(_ms(lambda: image_overlay(dense, q)))
    a, b = image_overlay(lazy, q), image_overlay(dense, q)
    L, H, N, _ = lazy.lazy.shape
    n_image = len(lazy.image_token_positions)
    kept = lazy.lazy.bytes_kept + (lazy.vision_attentions.nbytes if lazy.vision_attentions is not None else 0)
    dense_dec = lazy.lazy.dense_bytes
    dense_all = dense.attentions.nbytes + (dense.vision_attentions.nbytes if dense.vision_attentions is not None
                                           else 0)
    maps = max(float(np.abs(lazy.attention(i, h) - dense.attentions[i, h]).max()) for i in range(L) for h in range(H))
    med = statistics.median
    print(f"tiny random Qwen3-VL, {L} layers x {H} heads, {n_image:,} image + {n_text} text tokens (N = {N:,}), "
          f"{args.threads} threads, medians of {args.repeats} runs and {args.overlay_repeats} overlays (min-max)\n")
    print("| measure | lazy | dense | lazy / dense | target |")
    print("|---|---|---|---|---|")
    print(f"| bytes kept (decoder store; tower maps {'kept' if lazy.vision_attentions is not None else 'left out'}) "
          f"| {human(kept)} | {human(dense_dec)} (decoder maps) | {100 * kept / dense_dec:.2f} % | < 5 % |")
    print(f"| the dense run's maps, decoder + tower | – | {human(dense_all)} | {100 * kept / dense_all:.3f} % | – |")
    print(f"| run (forward, tower included) | {med(lazy_ms):.0f} ms ({min(lazy_ms):.0f}–{max(lazy_ms):.0f}) | "
          f"{med(dense_ms):.0f} ms ({min(dense_ms):.0f}–{max(dense_ms):.0f}) | {med(lazy_ms) / med(dense_ms):.2f} | – |")
    print(f"| overlay of token {q}, every layer × head ({L * H}) | {med(ov_lazy):.1f} ms "
          f"({min(ov_lazy):.1f}–{max(ov_lazy):.1f}) | {med(ov_dense):.1f} ms ({min(ov_dense):.1f}–{max(ov_dense):.1f}) "
          f"| {med(ov_lazy) / med(ov_dense):.2f} | ≤ 200 ms |")
    print(f"| lazy == dense: overlay / every map, max abs diff | {np.abs(a.picture - b.picture).max():.1e} / "
          f"{maps:.1e} | – | – | ≤ 1e-6 |")


if __name__ == "__main__":
    main()
