"""Our own checkpoints: one .safetensors file with the model's config in its metadata
(`save_checkpoint` writes it, `load_checkpoint` reads it back; `load_model(FILE)` goes through here)."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from attn_explorer.core.vit import ViTConfig, VisionTransformer
from attn_explorer.errors import UserError
from attn_explorer.hub.convert import config_from_fields
from attn_explorer.hub.built import Built, check_param_bytes, on_meta, regular_file
from attn_explorer.hub.images import ImagePreprocess

OWN_FAMILIES = {"vit": (ViTConfig, VisionTransformer)}


def save_checkpoint(model: Any, path: str | os.PathLike, family: str = "vit",
                    trained: bool = True, labels: dict[int, str] | None = None, note: str = "") -> Path:
    """Save one of our models as a single .safetensors file that load_model reads back. Written atomically."""
    from safetensors.torch import save_file

    from attn_explorer.files import atomic_write

    module = model if isinstance(model, torch.nn.Module) else model.module
    meta = {"format": "attn-explorer", "family": family, "config": json.dumps(dataclasses.asdict(module.cfg)),
            "trained": json.dumps(trained), "labels": json.dumps(labels or {}), "note": note}

    tensors = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def load_checkpoint(path: Path, device: Any = "cpu", dtype: torch.dtype = torch.float32) -> Built:
    """One of our .safetensors files onto device in dtype (built on the meta device, then filled)."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    regular_file(path, "checkpoint")
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        sd = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise UserError(f"{path.name} is not a readable .safetensors file ({str(e).splitlines()[0]})") from None
    if meta.get("format") != "attn-explorer":
        raise UserError(f"{path.name} was not saved by attn-explorer (no config inside); "
                        "to load Hugging Face weights, give the folder with config.json")
    family = meta.get("family")
    if family not in OWN_FAMILIES:
        raise UserError(f"{path.name}: unsupported family {family!r}; supported: {', '.join(OWN_FAMILIES)}")
    cfg_cls, model_cls = OWN_FAMILIES[family]
    if "config" not in meta:
        raise UserError(f"{path.name}: no config stored in the checkpoint")
    try:
        stored = json.loads(meta["config"])
    except json.JSONDecodeError as e:
        raise UserError(f"{path.name}: the stored config is not valid JSON ({e})") from None
    cfg = config_from_fields(cfg_cls, stored, path.name)
    check_param_bytes(lambda: model_cls(cfg), path.name, device, dtype)
    with on_meta():
        module = model_cls(cfg)
    ours = module.state_dict()
    bad = next((k for k, t in sd.items() if k in ours and t.shape != ours[k].shape), None)
    if bad is not None:
        raise UserError(f"{path.name}: checkpoint does not match its config (shape of {bad!r}: stored "
                        f"{tuple(sd[bad].shape)}, config {tuple(ours[bad].shape)})")
    sd = {k: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype) for k, t in sd.items()}
    missing, unexpected = module.load_state_dict(sd, strict=False, assign=True)
    if missing or unexpected:
        k = (missing or unexpected)[0]
        raise UserError(f"{path.name}: checkpoint does not match its config ({'missing' if missing else 'unexpected'} {k!r})")
    side = cfg.image_size
    info_kw = dict(name=str(path), family=family, modality="image", num_layers=cfg.num_layers,
                   num_heads=cfg.num_heads, hidden_size=cfg.dim, trained=json.loads(meta.get("trained", "true")),
                   note=meta.get("note", ""), patch_size=cfg.patch_size, image_size=side,
                   min_tokens=cfg.num_extra_tokens + 1,
                   max_positions=(side // cfg.patch_size) ** 2 + cfg.num_extra_tokens)
    labels = {int(k): v for k, v in json.loads(meta.get("labels", "{}")).items()}
    return Built(module, info_kw, dict(preprocess=ImagePreprocess.from_config(None, side), labels=labels), placed=True,
                 weights="trained" if info_kw["trained"] else "untrained")
