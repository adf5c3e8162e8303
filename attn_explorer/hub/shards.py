"""Weights of any size: a folder's checkpoint files (one file or shards named by an index), read as
headers first and then shard by shard straight into the target device and dtype.

The module is built on the meta device (no memory, no init, nothing patched process-wide: the meta
device is a thread-local mode, so a model built in another thread meanwhile keeps its real init).
The architecture's name map runs on meta tensors that stand for the checkpoint's (names, shapes and
dtypes read from the files' headers), so every key and shape is checked before a byte of weights is
read. Then each shard is read once, its tensors cast and moved one at a time, and assigned into the
module: the host holds at most one shard's tensors besides what lives on the CPU anyway.

When one device is not enough (`device="auto"` with `max_memory`), accelerate places our blocks
across GPUs, the CPU and disk (`infer_auto_device_map`, `dispatch_model`); we only read the weights
into the places it chose.
"""
from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from attn_explorer.errors import UserError, first_line
from attn_explorer.hub.built import regular_file

INDEXES = {"model.safetensors.index.json": "safetensors", "pytorch_model.bin.index.json": "bin"}
ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
             "BOOL": torch.bool}
# Our block class: accelerate never splits one across devices (its residual adds need both halves).
NO_SPLIT = ["TransformerBlock"]


def _unreadable(folder: Path, e: Exception) -> UserError:
    return UserError(f"{folder}: the weights file is corrupt or unreadable ({first_line(e)})")


def _pickle_refusal(path: Path, e: Exception) -> UserError:
    """torch.load(weights_only=True) refused the file: say why in our words. torch's own message advises
    re-running with weights_only=False, which would run whatever code the pickle carries."""
    import re

    if re.search(r"GLOBAL|Can only (create|build)|allowlist", str(e)):
        return UserError(f"refusing pickled code in {path} (loading it could run anything); "
                         "convert it to safetensors, or get a .safetensors copy of the model")
    return UserError(f"{path}: the weights file is corrupt or unreadable (not a PyTorch checkpoint)")


def _tensors_only(sd: Any, path: Path) -> dict[str, torch.Tensor]:
    """A state dict (maybe wrapped as {"state_dict": ...}) of name -> tensor, else one UserError line."""
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise UserError(f"{path} is not a state dict of tensors: it holds a {type(sd).__name__}")
    for k, v in sd.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise UserError(f"{path} is not a state dict of tensors: {k!r} is a {type(v).__name__}")
    return sd


def weight_files(folder: Path) -> tuple[list[Path], str]:
    """The checkpoint files of a folder and their kind ("safetensors" or "bin"): the files an index names
    (model.safetensors.index.json, pytorch_model.bin.index.json; any other file is ignored), else
    model.safetensors, else every *.safetensors file, else pytorch_model.bin. One UserError line when an
    index is unreadable or names a missing file."""
    for index_name, kind in INDEXES.items():
        index = folder / index_name
        if not index.exists():
            continue
        regular_file(index, "weights index")
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = list(dict.fromkeys(weight_map.values()))
            if not names or not all(isinstance(n, str) for n in names):
                raise ValueError("no file names in its weight_map")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
            raise UserError(f"{index}: not a readable weights index ({first_line(e)})") from None
        files = [folder / n for n in names]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise UserError(f"{folder}: {index_name} names {missing[0]}{more}, which is not in the folder "
                            "(an incomplete download?)")
        return [regular_file(f, "weights file") for f in files], kind
    single = folder / "model.safetensors"
    st = [single] if single.exists() else sorted(folder.glob("*.safetensors"))
    if st:
        return [regular_file(f, "weights file") for f in st], "safetensors"
    bin_ = folder / "pytorch_model.bin"
    if bin_.exists():
        return [regular_file(bin_, "weights file")], "bin"
    raise UserError(f"{folder}: no model.safetensors or pytorch_model.bin in the folder")


def _load_bin(path: Path) -> dict[str, torch.Tensor]:
    """An old .bin file with torch.load(weights_only=True), which refuses pickled code; memory-mapped
    when the file's format allows (nothing is read until a tensor is used)."""
    try:
        try:
            loaded = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except (RuntimeError, ValueError) as e:  # the legacy (pre-zip) format cannot be mapped
            if "mmap" not in str(e) and "zipfile" not in str(e).lower():
                raise
            loaded = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise _pickle_refusal(path, e) from None
    except (OSError, RuntimeError, ValueError, EOFError) as e:
        raise _unreadable(path.parent, e) from None
    return _tensors_only(loaded, path)


@dataclass
class Checkpoint:
    """A folder's weights before they are read: meta tensors standing for each stored tensor, and where
    each one lives. `tensors` goes through the architecture's checks and name map like real tensors."""

    folder: Path
    files: list[Path]
    kind: str
    tensors: dict[str, torch.Tensor]  # HF name -> meta tensor of the stored shape and dtype
    file_of: dict[str, Path]
    _bins: dict[Path, dict[str, torch.Tensor]] = field(default_factory=dict)  # memory-mapped .bin shards

    @property
    def nbytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    def read_file(self, f: Path, names: list[str]) -> Callable[[str], torch.Tensor]:
        """A getter for the named tensors of file f (CPU tensors)."""
        if self.kind == "bin":
            sd = self._bins.pop(f, None) or _load_bin(f)
            return sd.__getitem__
        from safetensors import safe_open

        # Memory-mapped: a float32 tensor kept on the CPU is the file's pages (read on first use, no copy,
        # no zero-filled allocation); a cast or a move to another device reads it once.
        handle = safe_open(str(f), "pt", device="cpu")
        return handle.get_tensor


def open_checkpoint(folder: Path) -> Checkpoint:
    """Headers of every checkpoint file of folder, as meta tensors; one UserError line on a bad file."""
    from safetensors import SafetensorError, safe_open

    files, kind = weight_files(folder)
    tensors: dict[str, torch.Tensor] = {}
    file_of: dict[str, Path] = {}
    bins: dict[Path, dict[str, torch.Tensor]] = {}
    for f in files:
        if kind == "bin":
            sd = bins[f] = _load_bin(f)
            items = [(k, tuple(v.shape), v.dtype) for k, v in sd.items()]
        else:
            try:
                with safe_open(str(f), "pt") as h:
                    items = []
                    for k in h.keys():
                        sl = h.get_slice(k)
                        dt = ST_DTYPES.get(sl.get_dtype())
                        if dt is None:
                            raise UserError(f"{f}: tensor {k!r} holds {sl.get_dtype()}, which this app cannot read")
                        items.append((k, tuple(sl.get_shape()), dt))
            except (SafetensorError, OSError, RuntimeError, ValueError) as e:
                raise _unreadable(folder, e) from None
        for k, shape, dt in items:
            tensors[k] = torch.empty(shape, dtype=dt, device="meta")
            file_of[k] = f
    return Checkpoint(folder, files, kind, tensors, file_of, bins)


def read_all(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of folder's checkpoint on the CPU, as stored (for tools and tests; loading a model
    goes shard by shard through `fill`)."""
    ck = open_checkpoint(folder)
    out: dict[str, torch.Tensor] = {}
    for f in ck.files:
        names = [k for k, g in ck.file_of.items() if g == f]
        try:
            get = ck.read_file(f, names)
            out.update({k: get(k) for k in names})
        except (OSError, RuntimeError, ValueError) as e:
            raise _unreadable(folder, e) from None
    return out


def plan(mapped: dict[str, torch.Tensor], hf: dict[str, torch.Tensor]) -> dict[str, tuple[str, bool]]:
    """Our name -> (checkpoint name, transposed), from the name map's answer on meta tensors: each of
    ours is a checkpoint tensor itself or its .t() view."""
    src = {id(t): k for k, t in hf.items()}
    out = {}
    for ours, t in mapped.items():
        base = t if t._base is None else t._base
        out[ours] = (src[id(base)], t._base is not None)
    return out


def _cast(t: torch.Tensor, device, dtype: torch.dtype, transposed: bool) -> torch.Tensor:
    if transposed:
        t = t.t()
    return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype).contiguous()


def fill(module: torch.nn.Module, ck: Checkpoint, where_of: dict[str, tuple[str, bool]],
         device: Callable[[str], Any], dtype: torch.dtype, progress: Callable[[float], None] | None = None,
         sink: Callable[[str, torch.Tensor], None] | None = None) -> None:
    """Read the checkpoint shard by shard into module's meta tensors: each of ours goes to device(name)
    in dtype (floating tensors; others keep theirs). A name whose device is "disk" goes to sink instead
    and stays on meta (accelerate reads it back when its block runs)."""
    from safetensors import SafetensorError

    by_file: dict[Path, list[tuple[str, str, bool]]] = {}
    for ours, (hf_name, tr) in where_of.items():
        by_file.setdefault(ck.file_of[hf_name], []).append((ours, hf_name, tr))
    for i, f in enumerate(ck.files):
        todo = by_file.get(f, [])
        try:
            get = ck.read_file(f, [h for _, h, _ in todo])
            shard = {}
            for ours, hf_name, tr in todo:
                dev = device(ours)
                if dev == "disk":  # written to the offload folder; the module keeps a meta stand-in in its dtype
                    t = _cast(get(hf_name), "cpu", dtype, tr)
                    sink(ours, t)
                    shard[ours] = torch.empty_like(t, device="meta")
                else:
                    shard[ours] = _cast(get(hf_name), dev, dtype, tr)
        except (SafetensorError, OSError, RuntimeError, ValueError) as e:
            raise _unreadable(ck.folder, e) from None
        module.load_state_dict(shard, strict=False, assign=True)  # adopts the tensors: no second copy
        del shard, get
        if progress:
            progress((i + 1) / len(ck.files))
    left = [k for k, t in module.state_dict().items() if t.is_meta and device(k) != "disk"]
    if left:
        raise UserError(f"{ck.folder}: {len(left)} tensor(s) were not filled, e.g. {left[0]!r}")


def auto_device_map(module: torch.nn.Module, dtype: torch.dtype, max_memory: dict | None) -> dict[str, Any]:
    """accelerate's placement of our blocks over the devices in max_memory (its own default: every GPU,
    then the CPU, then disk)."""
    from accelerate import infer_auto_device_map

    return infer_auto_device_map(module, max_memory=max_memory, no_split_module_classes=NO_SPLIT, dtype=dtype)


def device_of(device_map: dict[str, Any]) -> Callable[[str], Any]:
    """name -> the device its longest-prefix module is placed on, as device_map says."""
    def find(name: str):
        parts = name.split(".")
        for n in range(len(parts), -1, -1):
            key = ".".join(parts[:n])
            if key in device_map:
                d = device_map[key]
                return f"cuda:{d}" if isinstance(d, int) else d
        raise KeyError(name)
    return find


def dispatch(module: torch.nn.Module, device_map: dict[str, Any], offload_folder: str | None,
             offload_index: dict | None) -> torch.nn.Module:
    from accelerate import dispatch_model

    return dispatch_model(module, device_map, offload_dir=offload_folder, offload_index=offload_index)


def main_device(device_map: dict[str, Any]) -> torch.device:
    """Where a dispatched model takes its inputs: the first GPU it uses, else the CPU."""
    for d in device_map.values():
        if d not in ("cpu", "disk"):
            return torch.device(f"cuda:{d}" if isinstance(d, int) else d)
    return torch.device("cpu")
