"""Value-weighted norms (Kobayashi et al. 2020, "Attention is not only a weight").

A head's output for query i is Σ_j α_ij f_h(x_j), with f_h(x) = W_O^h (W_V^h x + b_V^h): the value of
token j after this head's slice of the output projection. A large weight α_ij on a token whose
f_h(x_j) is tiny moves nothing, so ‖α_ij f_h(x_j)‖ says more about what a head uses than α_ij alone.
Raw weights tend to pile onto [CLS], [SEP] and punctuation, whose transformed values are small.

`value_weighted_norms` is the pure formula on arrays; `model_norms` runs a model once (as Model.run
does) and captures each asked-for layer's values and W_O to feed it. b_O is added once after the heads
are summed, not per token, so it is not part of f_h (as in the paper).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from typing import TYPE_CHECKING

from attn_explorer.errors import UserError

if TYPE_CHECKING:  # the model is api's (import-linter sees this arrow); torch is imported in the functions
    from attn_explorer.api.model import Model


def transformed_value_norms(values, w_o) -> np.ndarray:
    """‖f_h(x_j)‖ = ‖W_O^h v_j^h‖ per head and token: values (H, N, d) (b_V included), w_o (D, H, d) -> (H, N).

    Computed through each head's Gram matrix W_O^hᵀ W_O^h (d × d), so no (H, N, D) array is made."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(w_o, dtype=np.float64)
    if v.ndim != 3 or w.ndim != 3 or w.shape[1:] != (v.shape[0], v.shape[2]):
        raise UserError(f"values (H, N, d) and W_O (D, H, d) do not fit: {v.shape} and {w.shape}")
    wh = np.ascontiguousarray(w.transpose(1, 2, 0))  # (H, d, D)
    gram = np.matmul(wh, wh.transpose(0, 2, 1))  # (H, d, d): W_O^hᵀ W_O^h
    sq = (np.matmul(v, gram) * v).sum(-1)  # (H, N): v_j^T G v_j
    return np.sqrt(np.maximum(sq, 0.0))


def value_weighted_norms(attn, values, w_o) -> np.ndarray:
    """‖α_ij f_h(x_j)‖ for one layer: attn (H, N, N), values (H, N, d), w_o (D, H, d) -> (H, N, N) float32.

    As α_ij ≥ 0 this is α_ij · ‖f_h(x_j)‖."""
    a = np.asarray(attn)
    fx = transformed_value_norms(values, w_o)
    if a.ndim != 3 or a.shape[0] != fx.shape[0] or a.shape[-1] != fx.shape[1]:
        raise UserError(f"attention {a.shape} does not match values for {fx.shape[0]} heads and {fx.shape[1]} tokens")
    return (a * fx[:, None, :]).astype(np.float32)


@dataclass
class LayerNorms:
    """Raw attention and value-weighted norms of some layers of one run (NumPy)."""

    layers: list[int]  # which layers, in order
    attentions: np.ndarray  # float32 (len(layers), H, N, N): α, from the same forward pass
    norms: np.ndarray  # float32 (len(layers), H, N, N): ‖α_ij f_h(x_j)‖
    value_norms: np.ndarray  # float32 (len(layers), H, N): ‖f_h(x_j)‖
    tokens: list[str]
    special: np.ndarray  # bool (N,)


def out_projections(module) -> list:
    """The W_O weights (D, H*d) and head counts of each layer of one of our models, in layer order."""
    from attn_explorer.core.blocks import BlockStack

    stack = next((m for m in module.modules() if isinstance(m, BlockStack)), None)
    if stack is None:
        raise UserError("this model has no attention layers to measure")
    return [block.attn for block in stack.layers]


def model_norms(model: Model, x, layers=None, **run_kw) -> LayerNorms:
    """Run `model` (an api Model) once on x and measure the value-weighted norms of `layers` (all when None).

    run_kw: dk_scale, dk_layers, max_tokens, image_size, as for Model.run."""
    import torch

    from attn_explorer.api.hooks import heads_first

    info = model.info
    unknown = set(run_kw) - {"dk_scale", "dk_layers", "max_tokens", "image_size"}
    if unknown:
        raise UserError(f"norms do not take {sorted(unknown)[0]!r}")
    want = list(range(info.num_layers)) if layers is None else [int(i) for i in layers]
    bad = [i for i in want if not 0 <= i < info.num_layers]
    if bad or not want:
        raise UserError(f"layer {bad[0] if bad else '?'} does not exist; the model has layers 0..{info.num_layers - 1}")
    dk_scale, dk_layers = model.check_dk(run_kw.get("dk_scale", 1.0), run_kw.get("dk_layers"))
    prep = model.prepare(x, max_tokens=run_kw.get("max_tokens"), image_size=run_kw.get("image_size"))
    t = model.trace(prep, names=[f"blocks.{i}.attn.hook_v" for i in want], dk_scale=dk_scale, dk_layers=dk_layers,
                    attentions=True)
    out = t.out
    attns = out_projections(model.module)
    att, nrm, fxn = [], [], []
    with torch.inference_mode():
        for i in want:
            mha = attns[i]
            w_o = mha.out.weight.float().view(mha.out.out_features, mha.num_heads, mha.head_dim)  # (D, H, d)
            a = out.attentions[0, i].float().cpu().numpy()  # (H, N, N)
            v = heads_first(t.cache[f"blocks.{i}.attn.hook_v"], info.num_heads)[0].float().cpu().numpy()  # (H, N, d), b_V included
            fx = transformed_value_norms(v, w_o.cpu().numpy())
            att.append(a)
            fxn.append(fx.astype(np.float32))
            nrm.append((a * fx[:, None, :]).astype(np.float32))
    if info.modality == "text":
        tokens, special = list(prep.tokens), np.asarray(prep.special, dtype=bool)
    else:
        r = model.result_of(t, prep, dk_scale)
        tokens, special = list(r.tokens), np.asarray(r.special, dtype=bool)
    return LayerNorms(want, np.stack(att), np.stack(nrm), np.stack(fxn), tokens, special)


def special_share(matrix: np.ndarray, special) -> float:
    """The share of a map's total (weight or norm) that lands on special-token columns."""
    m = np.asarray(matrix, dtype=np.float64)
    total = m.sum()
    if total <= 0:
        return 0.0
    return float(m[..., np.asarray(special, dtype=bool)].sum() / total)
