"""An image model reads a file path, a PIL image or a NumPy array; anything else is one line. A landscape
photo's run says that its sides were cut (the model reads square images)."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import attn_explorer as ax
from attn_explorer.errors import UserError
from attn_explorer.resources import resource_path


@pytest.fixture(scope="module")
def vit():
    return ax.load_model("tiny-vit-digits")


def test_an_array_is_the_same_picture_as_its_pil_image(vit):
    a = (np.random.default_rng(0).random((8, 8, 3)) * 255).astype(np.uint8)
    np.testing.assert_array_equal(vit.run(a).attentions, vit.run(Image.fromarray(a)).attentions)
    np.testing.assert_array_equal(vit.run(a.astype(np.float32) / 255).attentions, vit.run(a).attentions)
    assert vit.run(a[..., 0]).attentions.shape == vit.run(a).attentions.shape  # grey (H, W)


@pytest.mark.parametrize("bad", [np.zeros((8, 8, 5), np.uint8), np.zeros((0, 8, 3), np.uint8), np.zeros(8, np.uint8),
                                 np.full((8, 8, 3), 2.0), np.full((8, 8, 3), np.nan), np.zeros((8, 8, 3), np.int64),
                                 3.5, [[1, 2], [3, 4]], b"\x89PNG"])
def test_anything_else_is_one_line(vit, bad):
    with pytest.raises(UserError) as e:
        vit.run(bad)
    assert "\n" not in str(e.value)


def test_a_landscape_photo_says_it_was_cropped():
    m = ax.load_model("textbook-vit")
    photo = resource_path("samples", "rocket.jpg") if resource_path("samples", "rocket.jpg").exists() else None
    if photo is None:
        photo = Image.fromarray(np.zeros((427, 640, 3), np.uint8) + 90)
    r = m.run(photo if isinstance(photo, Image.Image) else str(photo))
    w, h = (photo.size if isinstance(photo, Image.Image) else Image.open(photo).size)
    assert w != h
    assert any("the model reads square images" in n for n in r.notes), r.notes
