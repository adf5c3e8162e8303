"""Choosing where the model runs: cuda, then mps, then cpu."""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def pick_device(name: str = "auto") -> torch.device:
    """'auto' picks cuda, then mps, then cpu. Raises ValueError for a device that is not there."""
    name = (name or "auto").lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA GPU is available; use --device cpu or auto")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device 'mps' was asked for but Apple's Metal backend is not available; use cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda or mps") from None


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    try:
        dtype = DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: use float32, bfloat16 or float16") from None
    return dtype  # float16 and bfloat16 run on the CPU too (torch has CPU kernels for every op we use)
