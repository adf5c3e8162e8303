"""What every loader in hub/ shares: the `Built` record and the checks made before anything large is
allocated or opened."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from attn_explorer.budget import available_bytes, device_type, human_bytes
from attn_explorer.errors import UserError


class _SkipInit(torch.overrides.TorchFunctionMode):
    """torch.nn.init's functions return their tensor untouched, in this thread only (a torch function
    mode lives on the current thread's mode stack; nothing global is patched, unlike the old skip_init)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs.get("tensor")
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta():
    """Build modules on the meta device without running their random init: the checkpoint fills every
    tensor, and init on meta tensors runs torch's Python reference kernels (normal_ on an nn.Embedding
    imported torch._refs: 3.5 s on a first load). Thread-local: a module built meanwhile in another thread
    gets its real, seeded init."""
    with torch.device("meta"), _SkipInit():
        yield


def _num_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# Share of the target device's free memory the weights may take: the process, its attention maps and the
# rest of the machine need the remainder (and CUDA's allocator some slack).
WEIGHT_SHARE = {"cpu": 0.8, "cuda": 0.9}


def state_bytes(module: torch.nn.Module, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of module's state with its floating tensors in dtype (integer ones keep theirs)."""
    return sum(t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size())
               for t in module.state_dict().values())


def check_fits(nbytes: int, where: str, device: Any = "cpu", dtype: torch.dtype = torch.float32) -> None:
    """One UserError line when weights of nbytes would not fit in the target device's free memory now
    (a share of it, WEIGHT_SHARE): how much is needed against how much is free."""
    kind = device_type(device)
    free = available_bytes(device)
    if free is None:
        return
    share = WEIGHT_SHARE.get(kind, 0.8)
    if nbytes > free * share:
        name = str(dtype).replace("torch.", "")
        raise UserError(f"{where}: its config would need {human_bytes(nbytes)} for the weights alone in {name}, "
                        f"but {human_bytes(free)} is free on {kind} (weights may take {share:.0%} of it); "
                        "is the config right? A smaller dtype, or device='auto' with max_memory, may fit")


def check_param_bytes(build: Callable[[], torch.nn.Module], where: str, device: Any = "cpu",
                      dtype: torch.dtype = torch.float32) -> int:
    """Build on the meta device (no memory, no init), and refuse with one line when the real module's
    weights in dtype would not fit on device (`check_fits`). Returns the predicted bytes."""
    with on_meta():
        nbytes = state_bytes(build(), dtype)
    check_fits(nbytes, where, device, dtype)
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
    placed: bool = False  # the module is already on its device and dtype (read there shard by shard)
    # what the weights are, for the model picker: "trained" or "untrained" where that is known (the
    # built-ins, our own checkpoints), else where they came from ("from tiny-bert"): a folder may hold
    # random weights, and nothing in it says otherwise
    weights: str = ""

    @property
    def num_params(self) -> int:
        return _num_params(self.module)
