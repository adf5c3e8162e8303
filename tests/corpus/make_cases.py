"""Builds the hostile inputs of the corpus as small files under a folder (tests call it with tmp_path).

Nothing here is committed as a binary: every model folder, checkpoint, picture and text file is made
on the spot, a few kB each. `build_all(root)` makes them all and returns {name: path}; the case
tables in `cases.py` refer to them as "{name}".

Run it by hand to look at the files: `python -m tests.corpus.make_cases /tmp/corpus`.
"""
from __future__ import annotations

import json
import os
import random
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "animal", "street", "it", "was", "tired", "cross", "."]
D, HEADS, INNER, POSITIONS = 8, 2, 12, 16  # the tiny BERT: width, heads, MLP width, positions


# ---- models ------------------------------------------------------------------------------------------

def bert_config(**change) -> dict:
    cfg = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": len(WORDS), "hidden_size": D,
           "num_hidden_layers": 1, "num_attention_heads": HEADS, "intermediate_size": INNER,
           "max_position_embeddings": POSITIONS, "type_vocab_size": 2, "hidden_act": "gelu",
           "layer_norm_eps": 1e-12}
    cfg.update(change)
    return cfg


def bert_tensors(dtype=np.float32) -> dict[str, np.ndarray]:
    """A one-layer BERT's weights under Hugging Face's names (random, seeded)."""
    rng = np.random.default_rng(0)
    shapes = {"embeddings.word_embeddings.weight": (len(WORDS), D),
              "embeddings.position_embeddings.weight": (POSITIONS, D),
              "embeddings.token_type_embeddings.weight": (2, D),
              "embeddings.LayerNorm.weight": (D,), "embeddings.LayerNorm.bias": (D,)}
    layer = "encoder.layer.0."
    for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
        shapes[layer + name + ".weight"] = (D, D)
        shapes[layer + name + ".bias"] = (D,)
    for name in ("attention.output.LayerNorm", "output.LayerNorm"):
        shapes[layer + name + ".weight"] = (D,)
        shapes[layer + name + ".bias"] = (D,)
    shapes.update({layer + "intermediate.dense.weight": (INNER, D), layer + "intermediate.dense.bias": (INNER,),
                   layer + "output.dense.weight": (D, INNER), layer + "output.dense.bias": (D,)})
    scale = 0.1 if dtype == np.float32 else 3.0  # integers: -3..3, not all zeros
    return {k: (rng.standard_normal(s) * scale).astype(dtype)
            for k, s in shapes.items()}


def bert_folder(folder: Path, config=None, tensors: dict | None = None, config_text: str | None = None) -> Path:
    """A Hugging Face-style folder: config.json, model.safetensors, vocab.txt."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    text = config_text if config_text is not None else json.dumps(bert_config() if config is None else config)
    (folder / "config.json").write_text(text, encoding="utf-8")
    save_file(bert_tensors() if tensors is None else tensors, str(folder / "model.safetensors"))
    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return folder


def vit_config(**change) -> dict:
    """A tiny ViTConfig (our own checkpoint format), as save_checkpoint stores it."""
    cfg = {"image_size": 32, "patch_size": 16, "channels": 3, "dim": 8, "num_layers": 1, "num_heads": 2,
           "mlp_hidden": 16, "eps": 1e-6, "act": "gelu", "qkv_bias": True, "distillation_token": False,
           "layerscale": None, "mask_token": False, "pooler": False, "num_labels": 0, "classifier_tokens": 1}
    cfg.update(change)
    return cfg


def own_checkpoint(path: Path, config_text: str | None = None, family: str = "vit", tensors: dict | None = None,
                   **meta_change) -> Path:
    """A .safetensors file in our own format (config in its metadata), its tensors stood in by one zero
    unless given: loading must fail on the config before it looks at them."""
    from safetensors.numpy import save_file

    meta = {"format": "attn-explorer", "family": family,
            "config": json.dumps(vit_config()) if config_text is None else config_text,
            "trained": "false", "labels": "{}", "note": "corpus"}
    meta.update(meta_change)
    save_file(tensors or {"cls_token": np.zeros((1, 1, 8), np.float32)}, str(path), metadata=meta)
    return path


def huge_checkpoint(path: Path) -> Path:
    """About 300 bytes on disk; its config asks for a ViT of ~87 billion parameters (349 GB in float32: more
    than any machine that runs the tests has free, whatever its size)."""
    return own_checkpoint(path, json.dumps(vit_config(dim=8192, num_layers=100, num_heads=64, mlp_hidden=36864,
                                                      image_size=224)))


def build_models(root: Path) -> dict[str, Path]:
    m = root / "models"
    m.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    out["good_bert"] = bert_folder(m / "good_bert")
    out["empty_folder"] = m / "empty_folder"
    out["empty_folder"].mkdir()
    out["config_list"] = bert_folder(m / "config_list", config_text="[1, 2, 3]")
    out["config_string"] = bert_folder(m / "config_string", config_text='"bert"')
    out["config_not_json"] = bert_folder(m / "config_not_json", config_text="{model_type: bert,")
    out["config_latin1"] = bert_folder(m / "config_latin1")
    (out["config_latin1"] / "config.json").write_bytes(b'{"model_type": "bert", "note": "caf\xe9"}')
    out["config_no_type"] = bert_folder(m / "config_no_type", config={k: v for k, v in bert_config().items()
                                                                       if k != "model_type"})
    out["config_unsupported"] = bert_folder(m / "config_unsupported", config=bert_config(model_type="t5"))
    out["config_missing_field"] = bert_folder(m / "config_missing_field", config={
        k: v for k, v in bert_config().items() if k != "intermediate_size"})
    out["heads_zero"] = bert_folder(m / "heads_zero", config=bert_config(num_attention_heads=0))
    out["heads_not_dividing"] = bert_folder(m / "heads_not_dividing", config=bert_config(num_attention_heads=3))
    out["heads_negative"] = bert_folder(m / "heads_negative", config=bert_config(num_attention_heads=-2))
    out["width_string"] = bert_folder(m / "width_string", config=bert_config(hidden_size="eight"))
    out["layers_float"] = bert_folder(m / "layers_float", config=bert_config(num_hidden_layers=1.5))
    out["activation_unknown"] = bert_folder(m / "activation_unknown", config=bert_config(hidden_act="swish9"))
    out["eps_string"] = bert_folder(m / "eps_string", config=bert_config(layer_norm_eps="tiny"))
    out["int_weights"] = bert_folder(m / "int_weights", tensors=bert_tensors(np.int32))
    out["bool_weights"] = bert_folder(m / "bool_weights", tensors={k: v > 0 for k, v in bert_tensors().items()})
    out["shape_mismatch"] = bert_folder(m / "shape_mismatch", config=bert_config(intermediate_size=13))
    out["weights_truncated"] = bert_folder(m / "weights_truncated")
    w = out["weights_truncated"] / "model.safetensors"
    w.write_bytes(w.read_bytes()[:200])
    out["weights_garbage"] = bert_folder(m / "weights_garbage")
    (out["weights_garbage"] / "model.safetensors").write_bytes(random.Random(1).randbytes(64))  # seeded noise
    out["weights_missing"] = bert_folder(m / "weights_missing")
    (out["weights_missing"] / "model.safetensors").unlink()
    out["weights_fifo"] = bert_folder(m / "weights_fifo")
    (out["weights_fifo"] / "model.safetensors").unlink()
    os.mkfifo(out["weights_fifo"] / "model.safetensors")
    out["config_fifo"] = bert_folder(m / "config_fifo")
    (out["config_fifo"] / "config.json").unlink()
    os.mkfifo(out["config_fifo"] / "config.json")
    out["config_folder"] = bert_folder(m / "config_folder")
    (out["config_folder"] / "config.json").unlink()
    (out["config_folder"] / "config.json").mkdir()
    # our own checkpoints
    out["ckpt_config_not_json"] = own_checkpoint(m / "ckpt_config_not_json.safetensors", "{dim: 8")
    out["ckpt_config_list"] = own_checkpoint(m / "ckpt_config_list.safetensors", "[8, 1, 2]")
    out["ckpt_unknown_field"] = own_checkpoint(m / "ckpt_unknown_field.safetensors",
                                               json.dumps(vit_config(colour="blue")))
    out["ckpt_no_config"] = own_checkpoint(m / "ckpt_no_config.safetensors")
    from safetensors.numpy import save_file

    save_file({"x": np.zeros(1, np.float32)}, str(out["ckpt_no_config"]),
              metadata={"format": "attn-explorer", "family": "vit"})
    out["ckpt_heads_zero"] = own_checkpoint(m / "ckpt_heads_zero.safetensors", json.dumps(vit_config(num_heads=0)))
    out["ckpt_wrong_tensors"] = own_checkpoint(m / "ckpt_wrong_tensors.safetensors")
    out["ckpt_bad_family"] = own_checkpoint(m / "ckpt_bad_family.safetensors", family="llama")
    out["ckpt_huge"] = huge_checkpoint(m / "ckpt_huge.safetensors")
    out["ckpt_foreign"] = m / "ckpt_foreign.safetensors"
    save_file({"w": np.zeros(3, np.float32)}, str(out["ckpt_foreign"]))  # plain safetensors, no metadata
    out["ckpt_empty"] = m / "ckpt_empty.safetensors"
    out["ckpt_empty"].write_bytes(b"")
    out["ckpt_fifo"] = m / "ckpt_fifo.safetensors"
    os.mkfifo(out["ckpt_fifo"])
    out["ckpt_text"] = m / "ckpt_text.safetensors"
    out["ckpt_text"].write_text("hello, not weights")
    out["not_a_model_file"] = m / "weights.txt"
    out["not_a_model_file"].write_text("just words")
    return out


# ---- pictures ------------------------------------------------------------------------------------------

def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(path: Path, width: int, height: int) -> Path:
    """A PNG whose header declares width × height RGB pixels, with one tiny IDAT: refused from the header."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + _chunk(b"IEND", b""))
    return path


def build_images(root: Path) -> dict[str, Path]:
    from PIL import Image

    im = root / "images"
    im.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    photo = Image.fromarray((rng.random((48, 64, 3)) * 255).astype(np.uint8), "RGB")
    out: dict[str, Path] = {}
    out["good_jpg"] = im / "good.jpg"
    photo.save(out["good_jpg"], quality=90)
    out["truncated_jpg"] = im / "truncated.jpg"
    out["truncated_jpg"].write_bytes(out["good_jpg"].read_bytes()[:300])
    out["zero_png"] = im / "zero.png"
    out["zero_png"].write_bytes(b"")
    out["text_png"] = im / "notes.png"
    out["text_png"].write_text("this is a shopping list, not a picture\n")
    out["huge_png"] = png_declaring(im / "huge.png", 100_000, 100_000)
    out["garbage_jpg"] = im / "garbage.jpg"
    # JPEG magic, then noise: seeded, since some random bytes make a header PIL refuses at once (another message)
    out["garbage_jpg"].write_bytes(b"\xff\xd8\xff\xe0" + random.Random(0).randbytes(200))
    out["image_folder"] = im / "folder.png"
    out["image_folder"].mkdir()
    out["image_fifo"] = im / "pipe.png"
    os.mkfifo(out["image_fifo"])
    out["image_missing"] = im / "missing.png"
    # pictures that should work
    out["one_pixel"] = im / "one.png"
    Image.new("RGB", (1, 1), (200, 30, 30)).save(out["one_pixel"])
    out["sixteen_bit"] = im / "sixteen.png"
    Image.fromarray((rng.random((40, 40)) * 65535).astype(np.uint16)).save(out["sixteen_bit"])
    out["cmyk_jpg"] = im / "cmyk.jpg"
    photo.convert("CMYK").save(out["cmyk_jpg"])
    out["palette_alpha"] = im / "palette_alpha.png"
    pal = photo.convert("P")
    pal.info["transparency"] = 0
    pal.save(out["palette_alpha"], transparency=0)
    out["animated_gif"] = im / "animated.gif"
    frames = [Image.new("RGB", (40, 30), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    frames[0].save(out["animated_gif"], save_all=True, append_images=frames[1:], duration=100, loop=0)
    out["wide_strip"] = im / "strip.png"
    Image.new("L", (4000, 2), 128).save(out["wide_strip"])
    return out


# ---- text files -------------------------------------------------------------------------------------------

def build_texts(root: Path) -> dict[str, Path]:
    t = root / "texts"
    t.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    out["latin1_txt"] = t / "latin1.txt"
    out["latin1_txt"].write_bytes("café au lait, s'il vous plaît".encode("latin-1"))
    out["invalid_utf8_txt"] = t / "invalid.txt"
    out["invalid_utf8_txt"].write_bytes(b"the animal \xff\xfe\xc3\x28 was tired")
    out["utf16_txt"] = t / "utf16.txt"
    out["utf16_txt"].write_bytes("the animal was tired".encode("utf-16"))
    out["big_txt"] = t / "big.txt"
    out["big_txt"].write_bytes(b"word " * 400_000)  # 2 MB: read, and cut to the model's positions
    out["huge_txt"] = t / "huge.txt"
    with out["huge_txt"].open("wb") as f:  # 64 MB, sparse (nothing written): over the limit for any text
        os.truncate(f.fileno(), 64_000_000)
    out["nul_txt"] = t / "nul.txt"
    out["nul_txt"].write_bytes(b"\x00" * 100)
    out["empty_txt"] = t / "empty.txt"
    out["empty_txt"].write_bytes(b"")
    out["text_folder"] = t / "notes.txt"
    out["text_folder"].mkdir()
    out["text_fifo"] = t / "pipe.txt"
    os.mkfifo(out["text_fifo"])
    out["text_missing"] = t / "missing.txt"
    return out


def build_all(root: str | os.PathLike) -> dict[str, Path]:
    root = Path(root)
    out = {"root": root}
    out.update(build_models(root))
    out.update(build_images(root))
    out.update(build_texts(root))
    (root / "out").mkdir(exist_ok=True)
    (root / "out" / "taken.npz").mkdir(exist_ok=True)  # --out naming an existing folder
    return out


if __name__ == "__main__":
    made = build_all(sys.argv[1] if len(sys.argv) > 1 else "corpus")
    for name, path in made.items():
        print(f"{name:24} {path}")
