"""Issue 24 A: a decoder block's element-wise steps, before and after, on Gemma 3 270M's shapes (width 640, 4 heads,
1 key/value head, d_k 256, MLP 2,048), random weights, n tokens.

"before" is the code as it was (copied here): RoPE with rotate_half (neg, cat), torch's rms_norm (on the CPU a
composite with a new tensor per step), act(gate) * up as two new tensors, x + branch. "after" is the code as it is.
Both run in the same process, interleaved (before, after, before, ...), CPU time (time.process_time) with one
thread; each row is the median of --reps pairs after one warm-up pair, and the two must give the same bits.

    python benchmarks/bench_elementwise.py [--n 4096] [--reps 11] [--dtypes float32,bfloat16]

A shared machine's load changes the times: compare the ratio within a run, and say the load (uptime).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attn_explorer.core.attention as attention  # noqa: E402
import attn_explorer.core.blocks as blocks  # noqa: E402
from attn_explorer.core.attention import AttentionOptions  # noqa: E402
from attn_explorer.core.blocks import TransformerBlock  # noqa: E402
from attn_explorer.core.layers import RMSNorm, SwiGLU  # noqa: E402
from attn_explorer.core.positional import apply_rope, rope_tables  # noqa: E402
from tests.core.test_elementwise_exact import gemma3_shaped_block  # noqa: E402


def old_rope(x, tables, layout="half"):
    cos, sin = tables
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def old_norm(self, x):
    shape = x.shape[-1:]
    if self.unit_offset:
        return F.rms_norm(x.float(), shape, 1.0 + self.weight.float(), self.eps).to(x.dtype)
    if x.dtype == self.weight.dtype == torch.float32:
        return F.rms_norm(x, shape, self.weight, self.eps)
    return self.weight * F.rms_norm(x, shape, None, self.eps)


def old_mlp(self, x):
    gate, up = self.gate_up(x).chunk(2, dim=-1) if self.fused else (self.gate(x), self.up(x))
    return self.down(self.act(gate) * up)


def old_residual(x, branch, lh, point):
    return x + branch


NEW = (apply_rope, RMSNorm.forward, SwiGLU.forward, blocks._residual)
OLD = (old_rope, old_norm, old_mlp, old_residual)


@contextlib.contextmanager
def code(new: bool):
    """The block's steps as they are (new) or as they were."""
    f = NEW if new else OLD
    attention.apply_rope, RMSNorm.forward, SwiGLU.forward, blocks._residual = f
    try:
        yield
    finally:
        attention.apply_rope, RMSNorm.forward, SwiGLU.forward, blocks._residual = NEW


def gemma3_block(dtype) -> TransformerBlock:
    """Gemma 3 270M's block shapes (hidden 640, MLP 2048, head 256) with random weights."""
    return gemma3_shaped_block(dtype, dim=640, mlp=2048, head_dim=256, std=0.05)


def cases(dtype, n: int) -> list:
    b = gemma3_block(dtype)
    x = (torch.randn(1, n, 640) * 2).to(dtype)
    q = torch.randn(1, n, 4, 256).to(dtype).transpose(1, 2)  # (B, H, N, d) as the attention hands it over
    k = torch.randn(1, n, 1, 256).to(dtype).transpose(1, 2)
    tables = rope_tables(n, 256, 10000.0, dtype=dtype)
    norms = [b.norm1, b.post_attn_norm, b.norm2, b.post_mlp_norm]

    def norms_of_a_layer():
        return [m(x) for m in norms] + [b.attn.q_norm(q), b.attn.k_norm(k)]

    def local_block():
        return b(x, AttentionOptions(causal=True, rope=tables, scale=256 ** -0.5, window=512))[0]

    return [("norms of a layer: 4 × (n, 640), q and k", norms_of_a_layer),
            ("RoPE on q and k", lambda: [attention.apply_rope(q, tables), attention.apply_rope(k, tables)]),
            ("GeGLU MLP, products included", lambda: b.mlp(x)),
            ("block, a local layer (window 512)", local_block)]


def same(a, b) -> bool:
    if isinstance(a, list):
        return all(same(u, v) for u, v in zip(a, b))
    return torch.equal(a, b)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load {os.getloadavg()[0]:.1f}, n = {args.n:,}, 1 thread, torch {torch.__version__}\n")
    print("| dtype | what | before ms | after ms | after / before | same bits |\n|---|---|---:|---:|---:|---|")
    with torch.inference_mode():
        for dtype in args.dtypes.split(","):
            for name, fn in cases(getattr(torch, dtype), args.n):
                times = {False: [], True: []}
                outs = {}
                for i in range(args.reps + 1):
                    for new in (False, True):
                        with code(new):
                            t0 = time.process_time()
                            outs[new] = fn()
                            if i:
                                times[new].append(time.process_time() - t0)
                before, after = statistics.median(times[False]), statistics.median(times[True])
                print(f"| {dtype} | {name} | {before * 1e3:.1f} | {after * 1e3:.1f} | {after / before:.2f} | "
                      f"{same(outs[False], outs[True])} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
