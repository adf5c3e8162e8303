"""Lesson "The Transformer block": one pre-LN block, point by point, and the residual stream of a real model.

The primer's block is  x = x + MHA(LN(x));  x = x + MLP(LN(x)).  `trace_block` runs core's
`TransformerBlock` (untrained, seeded) on the current sentence, embedded the textbook way (word vector
plus sinusoidal position), and records the tensor at each point of the diagram through forward hooks.
`stream_norms` runs the loaded model once (in a worker) and records the residual stream's size before
the first block and after every block.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from attn_explorer.core.blocks import BlockConfig, TransformerBlock
from attn_explorer.core.positional import sinusoidal_positions
from attn_explorer.core.textbook import split_words, word_vector
from attn_explorer.errors import UserError

# the points of the diagram, in order: key -> label
POINTS = {
    "x": "x (input)",
    "ln1": "LN₁(x)",
    "mha": "MHA(LN₁(x))",
    "res1": "x + MHA",
    "ln2": "LN₂(·)",
    "hidden": "GELU(W₁ ·) inside the MLP",
    "mlp": "MLP(LN₂(·))",
    "res2": "+ MLP (output)",
}
MAX_WORDS = 256


@dataclass
class Point:
    key: str  # one of POINTS
    label: str
    shape: tuple[int, ...]  # (N, D), or (N, mlp_hidden) inside the MLP
    norm: float  # mean over tokens of each token vector's length ‖v‖


@dataclass
class BlockTrace:
    words: list[str]
    dim: int
    num_heads: int
    mlp_hidden: int
    points: list[Point]
    tensors: dict[str, np.ndarray]  # key -> (N, ·) values at that point


def token_norm(x: np.ndarray | torch.Tensor) -> float:
    """Mean over tokens (rows) of each row's Euclidean length."""
    a = np.asarray(x, dtype=np.float64)
    return float(np.linalg.norm(a.reshape(-1, a.shape[-1]), axis=-1).mean())


@lru_cache(maxsize=8)
def lesson_block(dim: int = 64, num_heads: int = 4, mlp_hidden: int = 256, seed: int = 0) -> TransformerBlock:
    """One untrained pre-LN block with seeded weights (the same every time)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TransformerBlock(BlockConfig(dim, num_heads, mlp_hidden, norm_first=True, eps=1e-5)).eval()


def embed_words(text: str, dim: int) -> tuple[list[str], torch.Tensor]:
    """(words, (1, N, dim)): each word's seeded vector plus its sinusoidal position, as the textbook model."""
    words = split_words(text)
    if not words:
        raise UserError("the text has no words")
    words = words[:MAX_WORDS]
    x = torch.stack([word_vector(w, dim) for w in words]) + sinusoidal_positions(len(words), dim)
    return words, x[None]


def trace_block(text: str, dim: int = 64, num_heads: int = 4, mlp_hidden: int = 256, seed: int = 0) -> BlockTrace:
    """The tensor at each point of one pre-LN block for this text, caught by forward hooks."""
    if dim % num_heads:
        raise UserError(f"d_model={dim} is not divisible by {num_heads} heads")
    block = lesson_block(dim, num_heads, mlp_hidden, seed)
    words, x = embed_words(text, dim)
    seen: dict[str, torch.Tensor] = {}

    def keep(key: str, pre: bool = False):
        if pre:  # the sub-module's input: a point on the residual stream
            return lambda mod, args: seen.__setitem__(key, args[0].detach().clone())
        def after(mod, args, out):
            seen[key] = (out[0] if isinstance(out, tuple) else out).detach().clone()  # MHA returns (out, probs)
        return after

    hooks = [block.norm1.register_forward_pre_hook(keep("x", pre=True)),
             block.norm1.register_forward_hook(keep("ln1")),
             block.attn.register_forward_hook(keep("mha")),
             block.norm2.register_forward_pre_hook(keep("res1", pre=True)),
             block.norm2.register_forward_hook(keep("ln2")),
             block.mlp.fc2.register_forward_pre_hook(keep("hidden", pre=True)),
             block.mlp.register_forward_hook(keep("mlp")),
             block.register_forward_hook(keep("res2"))]
    try:
        with torch.inference_mode():
            block(x)
    finally:
        for h in hooks:
            h.remove()
    tensors = {k: seen[k][0].numpy() for k in POINTS}
    points = [Point(k, POINTS[k], tuple(tensors[k].shape), token_norm(tensors[k])) for k in POINTS]
    return BlockTrace(words, dim, num_heads, mlp_hidden, points, tensors)


@dataclass
class StreamNorms:
    model: str  # ModelInfo.name
    norm_first: bool  # pre-LN (True) or post-LN (False)
    trained: bool
    norms: list[float]  # mean token length before block 0, then after each block: num_layers + 1 entries
    num_tokens: int


def stream_norms(model, x, run_kw: dict | None = None) -> StreamNorms:
    """Run `model` (an api Model) once on x; the residual stream's mean token length at each layer boundary.

    Worker function (state.submit). run_kw: max_tokens / image_size as for Model.run."""
    kw = {k: v for k, v in (run_kw or {}).items() if k in ("max_tokens", "image_size")}
    prep = model.prepare(x, **kw)
    layers = model.module.blocks.layers
    norms: list[float | None] = [None] * (len(layers) + 1)
    tokens = [0]

    def before(mod, args):
        tokens[0] = int(args[0].shape[1])
        norms[0] = token_norm(args[0][0].float().cpu())

    def after(i):
        def hook(mod, args, out):
            norms[i + 1] = token_norm(out[0][0].float().cpu())
        return hook

    hooks = [layers[0].register_forward_pre_hook(before)]
    hooks += [blk.register_forward_hook(after(i)) for i, blk in enumerate(layers)]
    try:
        with torch.inference_mode():
            model.module(**prep.inputs)
    finally:
        for h in hooks:
            h.remove()
    return StreamNorms(model.info.name, bool(layers[0].norm_first), bool(model.info.trained),
                       [float(v) for v in norms], tokens[0])
