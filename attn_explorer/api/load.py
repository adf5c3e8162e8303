"""`load_model`: a built-in name, a local HF folder, our own .safetensors file or a hub id, as a `Model`.

`hub` turns the checkpoint into our module; here it goes to the chosen device and dtype and gets
its `ModelInfo`.
"""
from __future__ import annotations

import os

from attn_explorer.api.model import Model
from attn_explorer.api.result import ModelInfo
from attn_explorer.core.device import pick_device, pick_dtype
from attn_explorer.errors import UserError
from attn_explorer.hub.load import Progress, build, builtin_models, default_image_model, save_checkpoint


def load_model(src: str | os.PathLike = "minilm", device: str = "auto", dtype: str = "float32",
               progress: Progress | None = None) -> Model:
    """Load a model into our modules: a built-in name, an HF folder, our .safetensors, or a hub id."""
    try:
        dev = pick_device(device)
        dt = pick_dtype(dtype, dev)
    except ValueError as e:
        raise UserError(str(e)) from None
    built = build(src, progress)
    module = built.module.to(dev, dt).eval()
    info = ModelInfo(device=dev.type, dtype=str(dt).replace("torch.", ""), num_params=built.num_params, **built.info)
    return Model(module, info, **built.parts)


__all__ = ["load_model", "save_checkpoint", "builtin_models", "default_image_model", "Model", "ModelInfo"]
