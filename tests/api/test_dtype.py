"""dtype: float32, bfloat16 and float16 load and run on the CPU (bf16 was refused with "needs a GPU"); the
maps come back as float32 NumPy; `Model.dtype_error` measures the maps' and the last hidden state's error
against the float32 checkpoint; `--dtype` works in export and generate."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = "The capital of France is Paris. Attention lets every token look at the others."


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("dtype") / "m", tie_word_embeddings=False)


@pytest.mark.parametrize("src", ["minilm", "llama", "textbook-vit"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_models_run_on_the_cpu_and_give_float32_maps(src, dtype, llama):
    m = ax.load_model(str(llama) if src == "llama" else src, device="cpu", dtype=dtype)
    assert m.dtype == getattr(torch, dtype) and m.info.dtype == dtype and m.info.device == "cpu"
    if src == "textbook-vit":
        from PIL import Image

        x = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    else:
        x = TEXT
    r = m.run(x, hidden=True)
    assert r.attentions.dtype == np.float32 and r.hidden.dtype == np.float32
    assert np.isfinite(r.attentions).all()
    np.testing.assert_allclose(r.attentions.sum(-1), 1.0, atol=2e-2)  # rows are distributions, 16-bit sums


@pytest.mark.parametrize("dtype,bound", [("bfloat16", 0.1), ("float16", 0.02)])
def test_dtype_error_is_the_distance_to_the_float32_checkpoint(llama, dtype, bound):
    m = ax.load_model(str(llama), device="cpu", dtype=dtype)
    err = m.dtype_error(TEXT)
    f32 = ax.load_model(str(llama), device="cpu")
    a, b = m.run(TEXT, hidden=True), f32.run(TEXT, hidden=True)
    assert err["dtype"] == dtype and err["reference"] == "the checkpoint in float32" and err["tokens"] == a.num_tokens
    assert err["max_abs_attention"] == pytest.approx(float(np.abs(a.attentions - b.attentions).max()))
    assert err["max_abs_hidden"] == pytest.approx(float(np.abs(a.hidden - b.hidden).max()))
    assert 0 < err["max_abs_attention"] < bound  # 16 bits are not exact, and not wildly off either
    assert err["hidden_scale"] == pytest.approx(float(np.abs(b.hidden).max()))


def test_dtype_error_of_a_float32_model_is_zero(llama):
    err = ax.load_model(str(llama), device="cpu").dtype_error(TEXT)
    assert err["max_abs_attention"] == 0.0 and err["max_abs_hidden"] == 0.0 and err["dtype"] == "float32"


def test_dtype_error_without_a_source_compares_with_a_float32_copy(llama):
    m = ax.load_model(str(llama), device="cpu", dtype="bfloat16")
    m.source = None
    err = m.dtype_error(TEXT)
    assert err["reference"] == "a float32 copy of these weights" and err["max_abs_attention"] > 0
    assert m.dtype == torch.bfloat16  # the copy left the model as it was


def test_export_and_generate_take_dtype_on_the_cpu(tmp_path, llama):
    from attn_explorer.cli.main import main

    out = tmp_path / "a.npz"
    assert main(["export", "--model", str(llama), "--text", TEXT, "--device", "cpu", "--dtype", "bfloat16",
                 "--out", str(out)]) == 0
    d = np.load(out)
    assert d["attentions"].dtype == np.float32 and np.isfinite(d["attentions"]).all()
    g = tmp_path / "g.npz"
    assert main(["generate", "--model", str(llama), "--prompt", "The capital of", "--max-new-tokens", "3",
                 "--device", "cpu", "--dtype", "float16", "--out", str(g)]) == 0
    assert len(np.load(g)["token_ids"]) == 3
