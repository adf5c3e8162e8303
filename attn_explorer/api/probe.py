"""A model's own queries, keys and values, for measuring attention variants on real inputs.

`layer_qkv(model, x, layer)` runs the model once on x, exactly as `Model.run` would, and hands back
what layer `layer`'s attention worked on, per head. `head_trace(model, x, layer, head, query)` follows
one query through one head of that same forward pass: its q, the keys, each dot product, the scale,
the probabilities and the weighted sum of the values (the "Inside a head" lesson shows it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attn_explorer.api.hooks import heads_first
from attn_explorer.api.model import Model
from attn_explorer.core.attention import attention_scale
from attn_explorer.errors import UserError


def layer_qkv(model: Model, x, layer: int, **run_kw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v) of one layer for input x (text or image), each (H, N, d_k), contiguous, on the model's
    device and dtype. q and k are after RoPE and before the 1/sqrt(d_k) scale, so that layer's
    attention is softmax(q kᵀ · dk_scale / sqrt(d_k)). run_kw: dk_scale, dk_layers, max_tokens,
    image_size, as for Model.run (a dk_scale in earlier layers changes what reaches this one)."""
    L = model.info.num_layers
    try:
        layer = int(layer)
    except (TypeError, ValueError):
        raise UserError(f"layer must be a whole number, got {layer!r}") from None
    if not 0 <= layer < L:
        raise UserError(f"layer {layer} does not exist; the model has layers 0..{L - 1}")
    unknown = set(run_kw) - {"dk_scale", "dk_layers", "max_tokens", "image_size"}
    if unknown:
        raise UserError(f"layer_qkv does not take {sorted(unknown)[0]!r}")
    dk_scale, dk_layers = run_kw.get("dk_scale", 1.0), run_kw.get("dk_layers")
    prep = model.prepare(x, max_tokens=run_kw.get("max_tokens"), image_size=run_kw.get("image_size"))
    # Only this layer's q, k and v are kept, and no (L, H, N, N) stack: memory stays O(N) per layer at any N.
    names = [f"blocks.{layer}.attn.hook_{p}" for p in "qkv"]
    t = model.trace(prep, names=names, dk_scale=dk_scale, dk_layers=dk_layers)
    return tuple(heads_first(t.cache[n], model.info.num_heads)[0].contiguous() for n in names)  # (H, N, d_k) each


@dataclass
class HeadTrace:
    """One query's attention in one head, as a single forward pass computed it (NumPy, float64)."""

    layer: int
    head: int
    query: int  # token index of the query
    tokens: list[str]  # the input's N tokens
    q: np.ndarray  # (d_k,) the query's row of Q (after RoPE, before scaling)
    k: np.ndarray  # (N, d_k) every key
    v: np.ndarray  # (N, d_k) every value
    allowed: np.ndarray  # bool (N,): keys this query may look at (a causal model hides later tokens)
    logits: np.ndarray  # (N,) q · k_j, unscaled
    d_k: int
    dk_scale: float  # the d_k slider's multiplier, as applied in this layer
    scale: float  # the factor on the logits: dk_scale / sqrt(d_k)
    probs: np.ndarray  # (N,) the probabilities that forward pass computed (0 where not allowed)
    output: np.ndarray  # (d_k,) probs @ v: the head's output for this query, before W_O
    head_share: np.ndarray  # (D,) the same output after this head's slice of W_O (the forward's hook_z @ W_O)
    attention_row: np.ndarray  # (N,) RunResult.attentions[layer, head, query] of that forward, float32
    trained: bool  # False: random weights


def head_trace(model: Model, x, layer: int, head: int, query: int, **run_kw) -> HeadTrace:
    """Everything one head did for one query token, from ONE forward pass of `model` on x, run as
    Model.run runs it: that layer's q, k and values are captured, its attention comes from the same
    pass, and the weighted sum of the values is the head's output before W_O. run_kw: dk_scale,
    dk_layers, max_tokens, image_size, as for Model.run."""
    info = model.info
    unknown = set(run_kw) - {"dk_scale", "dk_layers", "max_tokens", "image_size"}
    if unknown:
        raise UserError(f"head_trace does not take {sorted(unknown)[0]!r}")
    try:
        layer, head, query = int(layer), int(head), int(query)
    except (TypeError, ValueError):
        raise UserError("layer, head and query must be whole numbers") from None
    if not 0 <= layer < info.num_layers:
        raise UserError(f"layer {layer} does not exist; the model has layers 0..{info.num_layers - 1}")
    if not 0 <= head < info.num_heads:
        raise UserError(f"head {head} does not exist; the model has heads 0..{info.num_heads - 1}")
    dk_scale, dk_layers = model.check_dk(run_kw.get("dk_scale", 1.0), run_kw.get("dk_layers"))
    prep = model.prepare(x, max_tokens=run_kw.get("max_tokens"), image_size=run_kw.get("image_size"))
    names = [f"blocks.{layer}.attn.hook_{p}" for p in "qkvz"]
    t = model.trace(prep, names=names, dk_scale=dk_scale, dk_layers=dk_layers, attentions=True)
    out = t.out
    result = model.result_of(t, prep, dk_scale)
    n = result.num_tokens
    if not 0 <= query < n:
        raise UserError(f"token {query} does not exist; the input has tokens 0..{n - 1}")
    q_all, k, v, z = (heads_first(t.cache[n], info.num_heads)[0, head].double() for n in names)  # (N, d_k) each
    d_k = q_all.shape[-1]
    used = dk_scale if dk_layers is None or layer in dk_layers else 1.0
    probs = out.attentions[0, layer, head, query].double()  # (N,): this pass's own softmax
    allowed = np.arange(n) <= query if info.causal else np.ones(n, dtype=bool)
    return HeadTrace(
        layer=layer, head=head, query=query, tokens=list(result.tokens), q=q_all[query].cpu().numpy(),
        k=k.cpu().numpy(), v=v.cpu().numpy(), allowed=allowed, logits=(k @ q_all[query]).cpu().numpy(),
        d_k=int(d_k), dk_scale=float(used), scale=attention_scale(d_k, used), probs=probs.cpu().numpy(),
        output=(probs @ v).cpu().numpy(), head_share=(z[query] @ model.W_O(layer)[head].double()).cpu().numpy(),
        attention_row=result.attentions[layer, head, query].copy(), trained=bool(info.trained),
    )
