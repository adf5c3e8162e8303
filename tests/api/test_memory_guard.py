"""A run whose attention maps would not fit in memory is refused before it starts, with the size."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attn_explorer as ax
from attn_explorer import budget
from attn_explorer.api import model as model_mod
from attn_explorer.errors import UserError


@pytest.fixture(scope="module")
def vit():
    return ax.load_model("textbook-vit", device="cpu")


def test_image_size_whose_maps_exceed_the_budget_is_refused(vit, monkeypatch):
    from attn_explorer.resources import resource_path

    photo = str(resource_path("samples", "coffee.jpg"))
    # 2048 px with 16-px patches: 16,385 tokens; 6 layers × 3 heads × 16,385² × 4 B = 19.3 GB
    need = 6 * 3 * (128 * 128 + 1) ** 2 * 4  # L · H · n² · 4 bytes, written out (not the guard's own sum)
    assert budget.attention_maps_bytes(128 * 128 + 1, 6, 3) == need and 19e9 < need < 20e9
    monkeypatch.setattr(model_mod, "default_budget", lambda device: 4 * 10**9)
    with pytest.raises(UserError) as e:
        vit.run(photo, image_size=2048, lazy=False)  # the maps themselves (automatic: q and k instead)
    msg = str(e.value)
    assert "16,385 tokens would need 19.3 GB" in msg and "\n" not in msg


def test_a_run_that_fits_goes_through(vit, monkeypatch):
    from attn_explorer.resources import resource_path

    monkeypatch.setattr(model_mod, "default_budget", lambda device: 4 * 10**9)
    r = vit.run(str(resource_path("samples", "coffee.jpg")), image_size=224)
    assert r.attentions.shape == (6, 3, 197, 197)


def test_text_guard_counts_tokens(monkeypatch):
    m = ax.load_model("textbook", device="cpu")
    monkeypatch.setattr(model_mod, "default_budget", lambda device: 100)  # bytes: 3 tokens need 2 × 4 × 3² × 4 = 288
    with pytest.raises(UserError, match="tokens would need"):
        m.run("a few words", lazy=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_two_byte_model_counts_its_maps_and_their_float32_copy(tmp_path, monkeypatch, dtype):
    """A 16-bit model holds its maps at 2 bytes an element, and the RunResult gets a float32 copy (4 bytes)
    while they are still held: 6 bytes an element, not 2 (nor 4). A budget between 2 and 6 bytes refuses."""
    from tests.corpus.make_cases import bert_folder

    m = ax.load_model(bert_folder(tmp_path / "bert"), device="cpu")
    m.module.to(dtype)
    text = "the animal was tired"
    n = len(m.prepare(text).tokens)
    L, H = m.info.num_layers, m.info.num_heads
    assert m.run(text).attentions.dtype == np.float32  # the copy the guard counts
    real = L * H * n * n * (2 + 4)  # L · H · n² · (2 bytes held + 4 of the float32 copy), written out
    monkeypatch.setattr(model_mod, "default_budget", lambda device: real - 1)  # 2 bytes an element would fit
    with pytest.raises(UserError, match=f"{n} tokens would need {budget.human_bytes(real)}"):
        m.run(text, lazy=False)
    monkeypatch.setattr(model_mod, "default_budget", lambda device: real)
    assert m.run(text).attentions.shape == (L, H, n, n)


def test_a_float32_model_counts_4_bytes_an_element(monkeypatch):
    m = ax.load_model("textbook", device="cpu")
    assert (m.info.num_layers, m.info.num_heads, len(m.prepare("a few words").tokens)) == (2, 4, 3)
    need = 2 * 4 * 3 ** 2 * 4  # L · H · n² · 4 bytes = 288, written out (not the guard's own function)
    monkeypatch.setattr(model_mod, "default_budget", lambda device: need)
    assert m.run("a few words").attentions.shape[-1] == 3
    monkeypatch.setattr(model_mod, "default_budget", lambda device: need - 1)
    with pytest.raises(UserError, match="tokens would need"):
        m.run("a few words", lazy=False)
