"""`load_model`: a built-in name, a local HF folder, our own .safetensors file or a hub id, as a `Model`.

`hub` builds our module on the meta device and reads the checkpoint straight onto the chosen device
and dtype, shard by shard; here it gets its `ModelInfo`.
"""
from __future__ import annotations

import functools
import os

from attn_explorer.api.model import Model
from attn_explorer.api.result import ModelInfo
from attn_explorer.core.device import pick_device, pick_dtype
from attn_explorer.errors import UserError
from attn_explorer.hub.load import Progress, build, builtin_models, default_image_model, save_checkpoint


def load_model(src: str | os.PathLike = "minilm", device: str = "auto", dtype: str = "float32",
               progress: Progress | None = None, max_memory: dict | None = None,
               offload_folder: str | os.PathLike | None = None) -> Model:
    """Load a model into our modules: a built-in name, an HF folder, our .safetensors, or a hub id.

    dtype: "float32", "bfloat16" or "float16" (on the CPU too). device="auto" with max_memory (e.g.
    {0: "20GiB", "cpu": "30GiB"}) lets accelerate place the blocks over GPUs, the CPU and disk
    (offload_folder); without max_memory it picks one device (cuda, then mps, then cpu)."""
    if max_memory is not None and str(device).lower() != "auto":
        raise UserError("max_memory spreads a model over devices: use it with device='auto'")
    try:
        dev = pick_device("cpu" if max_memory is not None and not _has_gpu(max_memory) else device)
        dt = pick_dtype(dtype, dev)
    except ValueError as e:
        raise UserError(str(e)) from None
    built = build(src, progress, dev, dt, max_memory, offload_folder)
    module = built.module if built.placed else built.module.to(dev, dt)
    module = module.eval()
    where = getattr(module, "main_device", None) or dev
    info = ModelInfo(device=where.type, dtype=str(dt).replace("torch.", ""), num_params=built.num_params,
                     **{"weights": built.weights or ("trained" if built.info.get("trained") else "untrained"),
                        **built.info})
    if info.modality == "image-text":  # vision-language (LLaVA, PaliGemma): run(image, text=...)
        from attn_explorer.api.vlm import VisionLanguageModel

        model = VisionLanguageModel(module, info, **built.parts)
    else:
        model = Model(module, info, **built.parts)
    model.source = dict(src=src, device=device, max_memory=max_memory, offload_folder=offload_folder)
    if src is not None:  # Model.dtype_error's reference: the same checkpoint again in float32 on the CPU
        model.reload_float32 = functools.partial(load_model, src, device="cpu", dtype="float32")
    return model


def _has_gpu(max_memory: dict) -> bool:
    return any(k not in ("cpu", "disk") for k in max_memory)


__all__ = ["load_model", "save_checkpoint", "builtin_models", "default_image_model", "Model", "ModelInfo"]
