"""A picture that is not the model's shape is not cut or stretched without a word: the preprocessing
says what it did (ImagePreprocess.crop_note), in a line the run's notes can carry."""
from __future__ import annotations

import numpy as np
from PIL import Image

from attn_explorer.hub.images import ImagePreprocess

DINO = {"size": {"shortest_edge": 256}, "do_center_crop": True, "crop_size": 224}  # DINOv2's recipe


def test_a_landscape_photo_s_centre_crop_is_said():
    prep = ImagePreprocess.from_config({"size": {"shortest_edge": 224}, "do_center_crop": True,
                                        "crop_size": 224}, 224)
    assert prep.crop_note((640, 427)) == "centre-cropped 640×427 to 427×427 (the model reads square images)"
    # DINOv2 resizes to 256 and crops 224: the middle 374 px of the short side are kept as well
    assert ImagePreprocess.from_config(DINO, 224).crop_note((640, 427)) == (
        "centre-cropped 640×427 to 374×374 (the model reads square images)")


def test_the_note_says_what_the_pixels_show():
    """The region named is the one the model saw: its side, scaled back, is the seen picture's."""
    prep = ImagePreprocess.from_config(DINO, 224)
    img = Image.fromarray(np.zeros((427, 640, 3), np.uint8))
    _, seen = prep(img)
    assert seen.shape[:2] == (224, 224)
    assert "374×374" in prep.crop_note(img.size)


def test_a_square_picture_or_a_plain_resize_of_one_needs_no_note():
    assert ImagePreprocess.from_config(DINO, 224).crop_note((500, 500)) == ""
    assert ImagePreprocess.from_config(None, 224).crop_note((300, 300)) == ""


def test_a_stretch_is_said_too():
    """A recipe that resizes to a fixed square (no crop) changes the picture's shape instead."""
    note = ImagePreprocess.from_config(None, 224).crop_note((640, 427))
    assert note == "stretched 640×427 to 224×224 (the model reads square images)"
