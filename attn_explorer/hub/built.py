"""What every loader in hub/ shares: the `Built` record, building a module without init, and the
checks made before anything large is allocated or opened."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from attn_explorer.budget import available_bytes
from attn_explorer.errors import UserError


def _num_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# Parameters (float32) above this are refused before anything is allocated: the largest model this app
# reads on a CPU (GPT-2 XL) needs 6.2 GB; a ~300-byte checkpoint asking for 17 GB took minutes to zero-fill.
MAX_PARAM_BYTES = 8e9


def check_param_bytes(build: Callable[[], torch.nn.Module], where: str) -> int:
    """Build on the meta device (no memory), and refuse with one line when the real module would not fit:
    over MAX_PARAM_BYTES, or over the memory free now. Returns the predicted bytes."""
    with torch.device("meta"), skip_init():
        nbytes = sum(t.numel() * 4 for t in build().state_dict().values())  # float32 on the CPU first
    free = available_bytes("cpu")
    limit = min(MAX_PARAM_BYTES, free) if free is not None else MAX_PARAM_BYTES
    if nbytes > limit:
        why = f"at most {MAX_PARAM_BYTES / 1e9:g} GB" if limit == MAX_PARAM_BYTES else f"{free / 1e9:.1f} GB is free"
        raise UserError(f"{where}: its config would need {nbytes / 1e9:.1f} GB for the weights alone ({why}); "
                        "is the config right?")
    return nbytes


def regular_file(path: Path, what: str) -> Path:
    """path, or one UserError line when it is not a regular file: a FIFO would block the open, a folder fails."""
    if not path.is_file():
        kind = "a folder" if path.is_dir() else "a device, pipe or socket"
        raise UserError(f"{path}: the {what} is not a regular file ({kind})")
    return path


@dataclass
class Built:
    """A module with its weights in place, and what makes it a `Model` (see `api.load`)."""

    module: torch.nn.Module
    info: dict  # ModelInfo fields, except device, dtype and num_params
    parts: dict[str, Any] = field(default_factory=dict)  # tokenizer=, preprocess=, labels=, encode=

    @property
    def num_params(self) -> int:
        return _num_params(self.module)


@contextlib.contextmanager
def skip_init():
    """Build modules without random init: the checkpoint overwrites every tensor anyway, and init
    on the meta device would import torch._dynamo (over a second at start-up)."""
    names = ("uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "ones_", "zeros_",
             "constant_", "xavier_uniform_", "xavier_normal_")
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda t, *a, **k: t)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)
