"""CLIP's and SigLIP's towers in our ViT and pre-LN blocks against transformers eager, on tiny random
configs saved with save_pretrained and read through our public loader."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from tests.hub.test_parity import TOL, _compare, _run_ours, _save, linear_path  # noqa: E402,F401

VISION = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37, image_size=16,
              patch_size=4, attn_implementation="eager")
TEXT = dict(vocab_size=99, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
            max_position_embeddings=20, attn_implementation="eager", bos_token_id=0, eos_token_id=2, pad_token_id=1)


def _spread(hf):
    """Random init leaves small activations, where quick-GELU and exact GELU nearly agree, and norms near
    identity: widen every tensor so a swapped activation, a missing norm or a lost bias shows."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p) if name.endswith("weight") else 0.3 * torch.randn_like(p))
            else:
                p.normal_(std=0.3)
    return hf.eval()


def _vision(kind):
    torch.manual_seed(0)
    if kind == "clip_vision_model":
        return _spread(transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**VISION)))
    if kind == "siglip_vision_model":
        return _spread(transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**VISION)))
    text = {k: v for k, v in TEXT.items() if k != "attn_implementation"}
    vision = {k: v for k, v in VISION.items() if k != "attn_implementation"}
    if kind == "clip":
        cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)
        return _spread(transformers.CLIPModel._from_config(cfg, attn_implementation="eager"))
    cfg = transformers.SiglipConfig(text_config=text, vision_config=vision)
    return _spread(transformers.SiglipModel._from_config(cfg, attn_implementation="eager"))


def _vision_tower(hf):
    return getattr(hf, "vision_model", hf)


@pytest.mark.parametrize("kind", ["clip_vision_model", "clip", "siglip_vision_model", "siglip"])
@pytest.mark.parametrize("hw", [(16, 16), (24, 12)])  # the trained grid, and a resized position table
def test_vision_tower_parity(tmp_path, kind, hw, linear_path):
    hf = _vision(kind)
    m = ax.load_model(str(_save(hf, tmp_path, kind)), device="cpu")
    family = "clip" if kind.startswith("clip") else "siglip"
    assert m.info.family == family and m.info.modality == "image" and m.info.num_heads == 3
    pixels = torch.randn(1, 3, *hw)
    with torch.no_grad():
        ref = _vision_tower(hf)(pixel_values=pixels, output_attentions=True, interpolate_pos_encoding=True)
    ours = _run_ours(m, pixels=pixels)
    extra = 1 if family == "clip" else 0
    assert ours.attentions.shape[-1] == (hw[0] // 4) * (hw[1] // 4) + extra
    _compare(ref, ours, 2)


def test_clip_vision_differs_from_plain_gelu(tmp_path):
    """The comparison is sharp: the same CLIP tower with exact GELU misses by far more than 1e-5."""
    hf = _vision("clip_vision_model")
    m = ax.load_model(str(_save(hf, tmp_path, "clip")), device="cpu")
    from attn_explorer.core.layers import activation

    for block in m.module.blocks.layers:
        block.mlp.act, block.mlp.fused_act = activation("gelu"), None
    pixels = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        ref = hf(pixel_values=pixels)
    assert (_run_ours(m, pixels=pixels).hidden - ref.last_hidden_state).abs().max() > 1e-3


def test_siglip_run_has_no_class_token(tmp_path):
    hf = _vision("siglip_vision_model")
    m = ax.load_model(str(_save(hf, tmp_path, "siglip")), device="cpu")
    from PIL import Image

    img = Image.fromarray((np.random.default_rng(0).random((16, 16, 3)) * 255).astype(np.uint8))
    r = m.run(img, hidden=True)
    assert r.patch_offset == 0 and r.tokens[0] == "r0c0" and not r.special.any()
    assert r.attentions.shape == (2, 3, 16, 16)
    clip = ax.load_model(str(_save(_vision("clip_vision_model"), tmp_path, "clipv")), device="cpu")
    rc = clip.run(img)
    assert rc.tokens[0] == "[CLS]" and rc.patch_offset == 1 and rc.attentions.shape[-1] == 17


@pytest.mark.parametrize("padded", [False, True])
def test_clip_text_tower_parity(tmp_path, padded, linear_path):
    torch.manual_seed(0)
    hf = _spread(transformers.CLIPTextModel(transformers.CLIPTextConfig(**TEXT)))
    m = ax.load_model(str(_save(hf, tmp_path, "cliptext")), device="cpu")
    assert m.info.family == "clip_text" and m.info.causal and not m.info.can_generate
    ids = torch.randint(3, 99, (2, 11))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 7:] = 0
        ids[1, 7:] = 1
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_attentions=True)
    ours = _run_ours(m, input_ids=ids, attention_mask=mask)
    for i, a in enumerate(ref.attentions):  # padded query rows are never read
        torch.testing.assert_close(ours.attentions[:, i][0], a[0], atol=TOL, rtol=0, msg=f"layer {i}")
        torch.testing.assert_close(ours.attentions[:, i][1, :, :7], a[1, :, :7], atol=TOL, rtol=0, msg=f"layer {i}")
    torch.testing.assert_close(ours.hidden[0], ref.last_hidden_state[0], atol=TOL, rtol=0)
    torch.testing.assert_close(ours.hidden[1, :7], ref.last_hidden_state[1, :7], atol=TOL, rtol=0)
    upper = torch.triu(torch.ones(11, 11, dtype=torch.bool), diagonal=1)
    assert ours.attentions[..., upper].abs().max() == 0  # the causal mask: nothing looks ahead


def test_clip_folder_text_tower_is_not_the_vision_tower(tmp_path):
    """A whole CLIP folder loads as its vision tower (the text weights are knowingly left out)."""
    hf = _vision("clip")
    m = ax.load_model(str(_save(hf, tmp_path, "pair")), device="cpu")
    assert m.info.modality == "image" and m.info.hidden_size == 24


# ---- preprocessing: our pixels against transformers' image processors, on real photos ---------------

CLIP_PREPROCESSOR = {  # openai/clip-vit-base-patch32's, as published (an int size and crop_size)
    "crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3, "size": 224,
}
CLIP_PREPROCESSOR_DICTS = dict(CLIP_PREPROCESSOR, size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
SIGLIP_PREPROCESSOR = {  # google/siglip-base-patch16-224's: a plain bicubic resize, mean = std = 0.5
    "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5], "resample": 3, "rescale_factor": 0.00392156862745098,
    "size": {"height": 224, "width": 224},
}


@pytest.mark.parametrize("photo", ["chelsea-cat.jpg", "coffee.jpg", "astronaut.jpg"])
@pytest.mark.parametrize("config,cls_name", [
    (CLIP_PREPROCESSOR, "CLIPImageProcessor"),
    (CLIP_PREPROCESSOR_DICTS, "CLIPImageProcessor"),
    (SIGLIP_PREPROCESSOR, "SiglipImageProcessor"),
])
def test_clip_siglip_pixels_match_transformers(photo, config, cls_name):
    from attn_explorer.hub.images import ImagePreprocess, open_image
    from attn_explorer.resources import resource_path

    img = open_image(str(resource_path("samples", photo)))
    ours, seen = ImagePreprocess.from_config(config, 224)(img)
    theirs = getattr(transformers, cls_name)(**config)(images=img, return_tensors="np")["pixel_values"][0]
    assert ours.shape == theirs.shape == (3, 224, 224) and seen.shape == (224, 224, 3)
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=0)


def test_clip_preprocessing_is_sharp():
    """ImageNet statistics instead of CLIP's, or a bilinear resize, miss CLIP's pixels by far."""
    from attn_explorer.hub.images import ImagePreprocess, open_image
    from attn_explorer.resources import resource_path

    img = open_image(str(resource_path("samples", "coffee.jpg")))
    theirs = transformers.CLIPImageProcessor(**CLIP_PREPROCESSOR)(images=img, return_tensors="np")["pixel_values"][0]
    imagenet = {k: v for k, v in CLIP_PREPROCESSOR.items() if k not in ("image_mean", "image_std")}
    for wrong in (imagenet, dict(CLIP_PREPROCESSOR, resample=2)):
        ours, _ = ImagePreprocess.from_config(wrong, 224)(img)
        assert np.abs(ours - theirs).max() > 1e-2


def test_clip_text_note_is_honest(tmp_path):
    """CLIP's text tower is causal without an LM head by design: no note calls it a bare base model."""
    hf = transformers.CLIPTextModel(transformers.CLIPTextConfig(**TEXT))
    m = ax.load_model(str(_save(hf, tmp_path, "cliptext")), device="cpu")
    assert not m.info.can_generate and "lm_head" not in m.info.note
