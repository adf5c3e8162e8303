"""A run whose attention maps would not fit in memory is refused before it starts, with the size."""
from __future__ import annotations

import pytest

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
    need = budget.attention_maps_bytes(128 * 128 + 1, 6, 3)
    assert 19e9 < need < 20e9
    monkeypatch.setattr(model_mod, "default_budget", lambda device: 4 * 10**9)
    with pytest.raises(UserError) as e:
        vit.run(photo, image_size=2048)
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
        m.run("a few words")
