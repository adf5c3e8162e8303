"""How far a 16-bit model is from float32: its maps and last hidden state against the same input run in float32."""
from __future__ import annotations

import copy

import numpy as np
import torch

from attn_explorer.errors import UserError


def dtype_error(model, x, **run_kw) -> dict:
    """How far this model's maps and last hidden state are from float32 on input x (one run of each).

    The reference is the same checkpoint loaded again in float32 on the CPU, so the error counts both
    the rounded weights and the 16-bit arithmetic; a model without a source to reload is compared with
    a float32 copy of its own (already rounded) weights. Returns plain numbers: dtype, reference,
    tokens, max_abs_attention, max_abs_hidden and hidden_scale (the largest |value| of the float32
    hidden state, to read max_abs_hidden against)."""
    if model.dtype == torch.float32:
        r = model.run(x, hidden=True, **run_kw)
        return dict(dtype="float32", reference="itself (the model is float32)", tokens=r.num_tokens,
                    max_abs_attention=0.0, max_abs_hidden=0.0, hidden_scale=float(np.abs(r.hidden).max()))
    mine = model.run(x, hidden=True, **run_kw)
    ref, what = float32_reference(model)
    base = ref.run(x, hidden=True, **run_kw)
    if mine.attentions.shape != base.attentions.shape:  # pragma: no cover - same tokenizer, same cut
        raise UserError("the float32 reference saw a different input; cannot compare")
    return dict(dtype=str(model.dtype).replace("torch.", ""), reference=what, tokens=mine.num_tokens,
                max_abs_attention=float(np.abs(mine.attentions - base.attentions).max()),
                max_abs_hidden=float(np.abs(mine.hidden - base.hidden).max()),
                hidden_scale=float(np.abs(base.hidden).max()))


def float32_reference(model):
    """(a float32 copy of model on the CPU, what it is): the checkpoint loaded again, or a copy of these weights."""
    reload = getattr(model, "reload_float32", None)  # set by api.load for a model loaded from a source
    if reload is not None and (getattr(model, "source", None) or {}).get("src") is not None:
        return reload(), "the checkpoint in float32"
    module = copy.deepcopy(model.module).to("cpu", torch.float32)
    return (type(model)(module, model.info, model.tokenizer, model.preprocess, model.labels, model._encode),
            "a float32 copy of these weights")
