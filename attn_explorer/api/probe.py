"""A model's own queries, keys and values, for measuring attention variants on real inputs.

`layer_qkv(model, x, layer)` runs the model once on x, exactly as `Model.run` would, and hands back
what layer `layer`'s attention worked on, per head.
"""
from __future__ import annotations

import torch

from attn_explorer.api.model import Model
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
    dk_scale, dk_layers = model._check_dk(run_kw.get("dk_scale", 1.0), run_kw.get("dk_layers"))
    prep = model.prepare(x, max_tokens=run_kw.get("max_tokens"), image_size=run_kw.get("image_size"))
    cap: dict = {}
    # Only this layer captures, and no (L, H, N, N) stack is kept: memory stays O(N) per layer at any N.
    model._forward(prep.inputs, dk_scale, dk_layers, captures={layer: cap}, output_attentions=False)
    return tuple(cap[name][0].contiguous() for name in ("q", "k", "values"))  # (H, N, d_k) each
