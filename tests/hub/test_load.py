"""load_model's sources, the public API, and every bad input it must refuse with one clear line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import attn_explorer as ax
from attn_explorer.errors import UserError

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "animal", "street", "it", "was", "tired", "cross", "."]


def tiny_bert_folder(path: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=len(WORDS), hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                  intermediate_size=30, max_position_embeddings=16)
    transformers.BertModel(cfg).save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    return path


@pytest.fixture(scope="module")
def textbook():
    return ax.load_model("textbook", device="cpu")


def test_public_api_text(textbook):
    r = textbook.run("The animal didn't cross the street because it was too tired")
    L, H = textbook.info.num_layers, textbook.info.num_heads
    assert r.attentions.dtype == np.float32 and r.attentions.shape == (L, H, len(r.tokens), len(r.tokens))
    np.testing.assert_allclose(r.attentions.sum(-1), 1.0, atol=1e-5)
    assert r.tokens[:2] == ["The", "animal"] and not textbook.info.trained


def test_dk_scale_flattens_or_sharpens_through_the_model(textbook):
    text = "one two three four five six"
    flat = textbook.run(text, dk_scale=1e-6).attentions
    np.testing.assert_allclose(flat, 1 / 6, atol=1e-5)
    ent = lambda a: float(-(a * np.log(a + 1e-12)).sum(-1).mean())  # noqa: E731
    assert ent(textbook.run(text, dk_scale=20).attentions) < ent(textbook.run(text).attentions) < ent(flat)


def test_dk_layers_only_changes_that_layer_and_after(textbook):
    text = "one two three four"
    base = textbook.run(text).attentions
    r = textbook.run(text, dk_scale=5.0, dk_layers=[1]).attentions
    np.testing.assert_array_equal(r[0], base[0])
    assert not np.allclose(r[1], base[1])


def test_max_tokens_and_truncation_note(textbook):
    r = textbook.run("a b c d e f g", max_tokens=3)
    assert r.tokens == ["a", "b", "c"] and r.truncated and "truncated" in r.notes[0]
    assert r.total_tokens == 7


def test_minilm_truncates_long_text_and_says_so():
    m = ax.load_model("minilm", device="cpu")
    r = m.run("word " * 700)
    assert len(r.tokens) == 512 and r.truncated and r.tokens[-1] == "[SEP]"
    assert any("truncated" in n for n in r.notes)
    r = m.run("the animal was tired", max_tokens=4)
    assert r.tokens == ["[CLS]", "the", "animal", "[SEP]"] and r.total_tokens == 6


def test_image_api_and_conversions(tmp_path):
    m = ax.load_model("textbook-vit", device="cpu")
    assert not m.info.trained and "untrained" in m.info.note
    rng = np.random.default_rng(0)
    modes = {
        "gray.png": Image.fromarray((rng.random((40, 60)) * 255).astype(np.uint8), "L"),
        "rgba.png": Image.fromarray((rng.random((40, 60, 4)) * 255).astype(np.uint8), "RGBA"),
        "palette.png": Image.fromarray((rng.random((40, 60, 3)) * 255).astype(np.uint8)).convert("P"),
        "sixteen.png": Image.fromarray((rng.random((40, 60)) * 65535).astype(np.uint16)),
        "huge.jpg": Image.new("RGB", (9000, 5000), (200, 30, 30)),
    }
    for name, img in modes.items():
        img.save(tmp_path / name)
        r = m.run(str(tmp_path / name))
        assert r.grid == (14, 14) and r.tokens[0] == "[CLS]" and len(r.tokens) == 197, name
        assert r.tokens[r.patch_offset] == "r0c0" and r.patch_offset == 1
        assert r.image.shape == (224, 224, 3) and r.image.dtype == np.uint8
    r = m.run(Image.new("RGB", (300, 200)), image_size=100)
    assert r.grid == (6, 6) and any("rounded" in n for n in r.notes)


def test_own_checkpoint_round_trip(tmp_path):
    m = ax.load_model("textbook-vit", device="cpu")
    path = ax.save_checkpoint(m, tmp_path / "tiny.safetensors", trained=False, note="test")
    m2 = ax.load_model(str(path), device="cpu")
    img = Image.new("RGB", (64, 64), (10, 200, 30))
    np.testing.assert_array_equal(m.run(img).attentions, m2.run(img).attentions)
    assert not list(tmp_path.glob("*.tmp"))


def test_bin_checkpoint_loads_with_weights_only(tmp_path):
    folder = tiny_bert_folder(tmp_path / "bin")
    from safetensors.torch import load_file

    sd = load_file(str(folder / "model.safetensors"))
    torch.save(sd, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    r = ax.load_model(str(folder), device="cpu").run("the animal was tired")
    assert r.tokens == ["[CLS]", "the", "animal", "was", "tired", "[SEP]"]


BAD_MODELS = [
    ("not_a_model", "no config.json"),
    ("unsupported", "unsupported architecture 't5'"),
    ("mismatched", "shape mismatch"),
    ("missing", "missing"),
    ("corrupt", "corrupt"),
    ("nonsense/../model", "not found"),
]


def _bad_folder(tmp_path: Path, kind: str) -> Path:
    folder = tmp_path / kind
    if kind == "not_a_model":
        folder.mkdir()
        (folder / "notes.txt").write_text("hello")
    elif kind == "unsupported":
        tiny_bert_folder(folder)
        cfg = json.loads((folder / "config.json").read_text())
        cfg["model_type"] = "t5"
        (folder / "config.json").write_text(json.dumps(cfg))
    elif kind == "mismatched":
        tiny_bert_folder(folder)
        cfg = json.loads((folder / "config.json").read_text())
        cfg["intermediate_size"] = 31
        (folder / "config.json").write_text(json.dumps(cfg))
    elif kind == "missing":
        tiny_bert_folder(folder)
        from safetensors.torch import load_file, save_file

        sd = load_file(str(folder / "model.safetensors"))
        sd.pop("encoder.layer.1.output.dense.weight")
        save_file(sd, str(folder / "model.safetensors"))
    elif kind == "corrupt":
        tiny_bert_folder(folder)
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 3])
    else:
        return Path(kind)
    return folder


@pytest.mark.parametrize("kind,message", BAD_MODELS)
def test_bad_model_sources_raise_one_line(tmp_path, kind, message):
    with pytest.raises(UserError) as e:
        ax.load_model(str(_bad_folder(tmp_path, kind)), device="cpu")
    assert message in str(e.value) and "\n" not in str(e.value)
    if kind == "unsupported":
        assert "bert" in str(e.value) and "vit" in str(e.value)  # lists what is supported
    if kind in ("mismatched", "missing"):
        assert "encoder.layer" in str(e.value) or "blocks.layers" in str(e.value)  # names the tensor


@pytest.mark.parametrize("bad", ["", "   ", "\n"])
def test_empty_text_refused(textbook, bad):
    with pytest.raises(UserError, match="empty"):
        textbook.run(bad)


@pytest.mark.parametrize("dk", [0, -1, float("nan"), float("inf"), "abc"])
def test_bad_dk_scale_refused(textbook, dk):
    with pytest.raises(UserError, match="dk_scale"):
        textbook.run("hello there", dk_scale=dk)


def test_bad_images_refused(tmp_path):
    m = ax.load_model("textbook-vit", device="cpu")
    (tmp_path / "fake.png").write_bytes(b"this is not a picture")
    good = tmp_path / "good.png"
    Image.new("RGB", (50, 50)).save(good)
    (tmp_path / "cut.png").write_bytes(good.read_bytes()[:60])
    for path, message in [(tmp_path / "missing.png", "not found"), (tmp_path / "fake.png", "not an image"),
                          (tmp_path / "cut.png", "could not be read"), (tmp_path, "folder")]:
        with pytest.raises(UserError, match=message):
            m.run(str(path))


def test_core_never_imports_qt_and_loading_skips_transformers_modeling():
    """The layering contract: core/ is pure PyTorch, and loading our own model never pays for
    transformers' modeling code (seconds at start-up)."""
    import re

    code = (
        "import sys, pkgutil, importlib, attn_explorer as ax, attn_explorer.core as core\n"
        "for mod in pkgutil.iter_modules(core.__path__): importlib.import_module('attn_explorer.core.' + mod.name)\n"
        "ax.load_model('minilm', device='cpu').run('hello world')\n"
        "bad = [k for k in sys.modules if k.startswith(('PySide6', 'pyqtgraph', 'transformers.models'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    forbidden = re.compile(r"^\s*(from|import)\s+(PySide6|pyqtgraph|transformers|attn_explorer\.(gui|hub|cost|workers|state))",
                           re.MULTILINE)
    for f in (ROOT / "attn_explorer" / "core").glob("*.py"):
        assert not forbidden.search(f.read_text()), f"{f.name} imports outside core's layer"


def _hub_cache(home: Path, repo: str, folder: Path) -> None:
    """Lay out HF_HOME/hub/models--org--name/snapshots/<rev>/ and refs/main, as huggingface_hub does."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    base = home / "hub" / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in folder.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(rev)


def test_hub_id_from_offline_cache(tmp_path):
    folder = tiny_bert_folder(tmp_path / "src")
    home = tmp_path / "hf"
    _hub_cache(home, "acme/tiny-bert", folder)
    env = dict(os.environ, HF_HOME=str(home), HF_HUB_OFFLINE="1")
    out = tmp_path / "o.npz"
    p = subprocess.run([sys.executable, "main.py", "export", "--model", "acme/tiny-bert", "--text", "the animal",
                        "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    d = np.load(out)
    assert list(d["tokens"]) == ["[CLS]", "the", "animal", "[SEP]"] and d["attentions"].shape == (2, 3, 4, 4)
    p = subprocess.run([sys.executable, "main.py", "export", "--model", "acme/not-cached", "--text", "x",
                        "--out", str(tmp_path / "n.npz")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "not in the local Hugging Face cache" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "n.npz").exists()


def test_folder_weights_are_labelled_by_their_folder_never_trained(tmp_path):
    """A folder's weights may be random (these are): nothing in it says they were trained, so the label
    names where they came from. The built-ins, whose training is known, keep theirs."""
    from attn_explorer.hub.load import build

    folder = tiny_bert_folder(tmp_path / "tiny-bert")
    assert build(str(folder)).weights == "from tiny-bert"
    assert build(str(folder) + "/").weights == "from tiny-bert"
    assert build("textbook").weights == "untrained" and build("textbook-vit").weights == "untrained"
    assert build("minilm").weights == "trained"
    m = ax.load_model("textbook-vit", device="cpu")
    assert build(str(ax.save_checkpoint(m, tmp_path / "v.safetensors", trained=False))).weights == "untrained"
