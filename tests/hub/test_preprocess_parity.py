"""Our image preprocessing gives the same pixels as transformers' image processors, on real photos.

A swapped mean/std, a shortest edge of 255 instead of 256, or a different resample filter all change
these numbers: shapes alone would not notice.
"""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from attn_explorer.hub.dinov2_onnx import PREPROCESSOR_CONFIG
from attn_explorer.hub.images import ImagePreprocess, open_image
from attn_explorer.resources import resource_path

transformers = pytest.importorskip("transformers")

PHOTOS = ["chelsea-cat.jpg", "coffee.jpg", "astronaut.jpg"]
VIT_CONFIG = {  # google/vit-base-patch16-224's: a plain resize to 224×224, mean = std = 0.5
    "do_resize": True, "size": {"height": 224, "width": 224}, "resample": 2, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}
CLIP_STYLE = {  # shortest edge, then a crop, ImageNet statistics (BEiT/DeiT-style)
    "do_resize": True, "size": {"shortest_edge": 256}, "resample": 3, "do_center_crop": True,
    "crop_size": {"height": 224, "width": 224}, "do_rescale": True, "rescale_factor": 1 / 255,
    "do_normalize": True, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
}


def _theirs(processor_cls, config: dict, img: Image.Image) -> np.ndarray:
    proc = processor_cls(**{k: v for k, v in config.items() if k != "image_processor_type"})
    return proc(images=img, return_tensors="np")["pixel_values"][0]


@pytest.mark.parametrize("photo", PHOTOS)
@pytest.mark.parametrize("name,config,cls_name", [
    ("dinov2", PREPROCESSOR_CONFIG, "BitImageProcessor"),
    ("vit", VIT_CONFIG, "ViTImageProcessor"),
    ("deit", CLIP_STYLE, "DeiTImageProcessor"),
])
def test_pixels_match_transformers(photo, name, config, cls_name):
    img = open_image(str(resource_path("samples", photo)))
    ours, seen = ImagePreprocess.from_config(config, 224)(img)
    theirs = _theirs(getattr(transformers, cls_name), config, img)
    assert ours.shape == theirs.shape == (3, 224, 224)
    assert seen.shape == (224, 224, 3)
    # both resize with PIL; the rest is float arithmetic in a different order
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=0)


def test_a_different_recipe_is_noticed():
    """The comparison is sharp: mean/std swapped, or a 255-pixel shortest edge, breaks it."""
    img = open_image(str(resource_path("samples", PHOTOS[0])))
    theirs = _theirs(transformers.BitImageProcessor, PREPROCESSOR_CONFIG, img)
    swapped = dict(PREPROCESSOR_CONFIG, image_mean=PREPROCESSOR_CONFIG["image_std"],
                   image_std=PREPROCESSOR_CONFIG["image_mean"])
    edge255 = dict(PREPROCESSOR_CONFIG, size={"shortest_edge": 255})
    for wrong in (swapped, edge255):
        ours, _ = ImagePreprocess.from_config(wrong, 224)(img)
        assert np.abs(ours - theirs).max() > 1e-2
