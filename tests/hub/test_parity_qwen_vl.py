"""Qwen2.5-VL against transformers eager: tiny random configs built here, images made here, every weight moved
off its init (norms too). The vision tower (core.qwen_vision: 3-D patch conv, 2-D RoPE, windowed and full
attention blocks, the patch merger) at module level: every tower map (transformers runs each window alone in its
window order; its maps are put back in the processor's patch order) and the merged output within 1e-5; then the
whole model through ax.load_model: the processor's size (smart_resize) and patches, the prompt's expansion, the
decoder's M-RoPE maps and hidden state, the tower's maps, and greedy tokens against transformers fed our ids and
pixels."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.core.qwen_vision import (QWEN_VISION_RULES, QwenVisionConfig, QwenVisionTower,  # noqa: E402
                                            patch_positions)
from tests.hub.tiny_vlm import eager_perturbed, save_folder  # noqa: E402

TOL = 1e-5
# patch 4, merge 2, window 16 px = 2 image tokens a side: a 40 × 24 px picture is 10 × 6 patches, 5 × 3 image
# tokens, windows of 2 × 2 tokens with ragged ones at the right and bottom edges; blocks 1 and 3 attend fully
VISION = dict(depth=4, hidden_size=32, intermediate_size=40, num_heads=4, out_hidden_size=48, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, window_size=16, fullatt_block_indexes=[1, 3])


def tower_pair(seed=0):
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf_mod

    torch.manual_seed(seed)
    cfg = transformers.Qwen2_5_VLVisionConfig(**VISION)
    cfg._attn_implementation = "eager"
    hf = hf_mod.Qwen2_5_VisionTransformerPretrainedModel(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours = QwenVisionTower(QwenVisionConfig(
        dim=32, num_layers=4, num_heads=4, mlp_hidden=40, out_dim=48, patch_size=4, merge=2, window_size=16,
        full_layers=[1, 3], temporal_patch_size=2)).eval()
    import re
    state = {}
    for k, v in hf.state_dict().items():
        for pat, rep in QWEN_VISION_RULES:
            if re.fullmatch(pat, k):
                state[re.sub(pat, rep, k)] = v
                break
        else:
            raise AssertionError(f"unmapped {k}")
    ours.load_state_dict(state, strict=True)
    return hf, ours


def picture(h=24, w=40, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def processor_pixels(img):
    """The processor's flattened patches and grid for a picture already at multiples of patch × merge."""
    from PIL import Image

    ip = transformers.Qwen2VLImageProcessor(patch_size=4, merge_size=2, temporal_patch_size=2,
                                            min_pixels=16, max_pixels=10_000)
    out = ip(images=[Image.fromarray(img)], return_tensors="pt")
    return out["pixel_values"].float(), out["image_grid_thw"]


def hf_tower_maps(hf, pixels, grid):
    """transformers' eager maps, each window's block put back at its patches in the processor's order."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf_mod
    from transformers.vision_utils import get_vision_window_index

    got = []
    orig = hf_mod.eager_attention_forward

    def spy(module, q, *a, **kw):
        out, w = orig(module, q, *a, **kw)
        got.append(w)
        return out, w

    hf_mod.eager_attention_forward = spy
    try:
        with torch.no_grad():
            out = hf(pixels, grid_thw=grid)
    finally:
        hf_mod.eager_attention_forward = orig
    P = pixels.shape[0]
    cfg = hf.config
    index, _ = get_vision_window_index(grid, cfg.spatial_merge_size, cfg.window_size, cfg.patch_size)
    unit = cfg.spatial_merge_size ** 2
    order = (index[:, None] * unit + torch.arange(unit)).flatten()  # window order -> the processor's patch index
    maps, it = [], iter(got)
    for layer in range(cfg.depth):
        full = torch.zeros(cfg.num_heads, P, P)
        at = 0
        while at < P:
            w = next(it)[0]
            n = w.shape[-1]
            idx = order[at:at + n]
            full[:, idx[:, None], idx[None, :]] = w
            at += n
        maps.append(full)
    return out, torch.stack(maps)


def test_qwen2_5_vl_tower_matches_transformers():
    hf, ours = tower_pair()
    pixels, grid = processor_pixels(picture())
    assert grid.tolist() == [[1, 6, 10]]
    ref, ref_maps = hf_tower_maps(hf, pixels, grid)
    with torch.no_grad():
        out = ours(pixels, tuple(grid[0].tolist()), output_attentions=True)
    maps = (out.attentions - ref_maps).abs().max().item()
    merged = (out.hidden - ref.pooler_output).abs().max().item()
    # transformers' last_hidden_state is in its window order
    from transformers.vision_utils import get_vision_window_index
    index, _ = get_vision_window_index(grid, 2, 16, 4)
    order = (index[:, None] * 4 + torch.arange(4)).flatten()
    blocks = (out.blocks_out[order] - ref.last_hidden_state).abs().max().item()
    print(f"qwen2_5_vl tower: maps {maps:.2e} merged {merged:.2e} blocks {blocks:.2e}")
    assert maps < TOL and merged < TOL and blocks < TOL
    # the windowed blocks keep to their windows (exact zeros), the full ones do not
    assert (out.attentions[0] == 0).any() and not (out.attentions[1] == 0).any()
    assert out.hidden.shape == (15, 48)


PAD, START, END = 300, 301, 302  # <|image_pad|>, <|vision_start|>, <|vision_end|> added to the 300-token tokenizer
TEXT = dict(vocab_size=304, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]})


def tokenizer():
    from tokenizers import AddedToken

    from tests.tiny_llama import train_tokenizer

    tok = train_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")])
    assert tok.token_to_id("<|image_pad|>") == PAD
    return tok


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2_5_vl")
    torch.manual_seed(5)
    cfg = transformers.Qwen2_5_VLConfig(text_config=TEXT, vision_config=VISION, image_token_id=PAD,
                                        vision_start_token_id=START, vision_end_token_id=END, tie_word_embeddings=False)
    hf = eager_perturbed(transformers.Qwen2_5_VLForConditionalGeneration, cfg)
    save_folder(hf, folder, tokenizer(), {"min_pixels": 64, "max_pixels": 10_000, "patch_size": 4, "merge_size": 2})
    return hf, folder


def test_qwen2_5_vl_parity_with_transformers(qwen_folder):
    from PIL import Image

    hf, folder = qwen_folder
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.modality == "image-text" and m.info.family == "qwen2_5_vl"
    img = picture(27, 37)  # smart_resize: 24 × 40 px (multiples of 8), 3 × 5 image tokens
    prompt = "the cat <image> sat on"
    prep = m.prepare(img, text=prompt)
    ids, (patches, grid) = prep.inputs["input_ids"], prep.inputs["pixels"]
    # the processor's own pixels for the same picture
    ip = transformers.Qwen2VLImageProcessor(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=64,
                                            max_pixels=10_000)
    want = ip(images=[Image.fromarray(img)], return_tensors="pt")
    assert want["image_grid_thw"].tolist() == [list(grid)] == [[1, 6, 10]]
    px = (patches - want["pixel_values"]).abs().max().item()
    assert px < 1e-5, px
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer())
    want_ids = hf_tok("the cat <|vision_start|>" + "<|image_pad|>" * 15 + "<|vision_end|> sat on",
                      add_special_tokens=False)["input_ids"]
    assert ids[0].tolist() == want_ids

    r = m.run(img, text=prompt, hidden=True)
    thw = torch.tensor([list(grid)])
    mm = (ids == PAD).int()
    with torch.no_grad():
        ref = hf.model(input_ids=ids, pixel_values=patches, image_grid_thw=thw, mm_token_type_ids=mm,
                       output_attentions=True)
    _, tower_maps = hf_tower_maps(hf.model.visual, patches, thw)
    # r.vision_attentions lists the patches row by row (r.grid: the patch grid), transformers' maps (put back in
    # the processor's merge-block-major order above) are permuted to match
    pos = patch_positions(tuple(grid), 2)
    order = torch.argsort(pos[:, 0] * 10 + pos[:, 1])
    tower_maps = tower_maps[:, :, order][..., order]
    assert r.grid == (6, 10)
    dec = max(np.abs(r.attentions[i] - a[0].numpy()).max() for i, a in enumerate(ref.attentions))
    vis = np.abs(r.vision_attentions[0] - tower_maps.numpy()).max()
    hid = np.abs(r.hidden - ref.last_hidden_state[0].numpy()).max()
    print(f"qwen2_5_vl: decoder maps {dec:.2e} tower maps {vis:.2e} hidden {hid:.2e} pixels {px:.2e}")
    assert len(ref.attentions) == r.attentions.shape[0] == 3
    assert dec <= TOL and vis <= TOL and hid <= TOL
    pos = r.image_token_positions
    assert pos.shape == (15, 5) and (ids[0, pos[:, 0]] == PAD).all() and (pos[:, 4] == 2).all()
    assert pos[-1, 2:4].tolist() == [2, 4] and r.tokens[pos[-1, 0]] == "<image r2c4>"

    g = m.generate(img, text=prompt, max_new_tokens=6)
    with torch.no_grad():
        out = hf.generate(input_ids=ids, pixel_values=patches, image_grid_thw=thw, mm_token_type_ids=mm,
                          max_new_tokens=6, do_sample=False)
    assert g.ids == out[0, ids.shape[1]:].tolist()


def test_qwen2_5_vl_hub_checkpoint_form(qwen_folder, tmp_path):
    """The config.json Qwen2.5-VL-3B-Instruct ships (decoder fields at the top level, legacy rope_scaling
    {"type": "mrope"} and rope_theta, torch_dtype, its vision_config keys) shrunk to the tiny sizes, with the
    hub's weight names (visual.*, model.layers.*, lm_head): the same maps as the transformers-5 folder."""
    from safetensors.torch import load_file, save_file

    hf, folder = qwen_folder
    real = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 1,
            "eos_token_id": 2, "vision_start_token_id": START, "vision_end_token_id": END, "vision_token_id": 303,
            "image_token_id": PAD, "video_token_id": 303, "hidden_act": "silu", "hidden_size": 48,
            "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 256, "max_window_layers": 3,
            "model_type": "qwen2_5_vl", "num_attention_heads": 6, "num_hidden_layers": 3, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 256, "tie_word_embeddings": False,
            "torch_dtype": "float32", "transformers_version": "4.41.2", "use_cache": True, "use_sliding_window": False,
            "vision_config": {"depth": 4, "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 40,
                              "num_heads": 4, "in_chans": 3, "out_hidden_size": 48, "patch_size": 4,
                              "spatial_merge_size": 2, "spatial_patch_size": 4, "window_size": 16,
                              "fullatt_block_indexes": [1, 3], "tokens_per_second": 2, "temporal_patch_size": 2},
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}, "vocab_size": 304}
    (tmp_path / "config.json").write_text(json.dumps(real))
    state = load_file(str(folder / "model.safetensors"))
    renamed = {k.replace("model.visual.", "visual.").replace("model.language_model.", "model."): v
               for k, v in state.items()}
    assert any(k.startswith("visual.") for k in renamed) and any(k.startswith("model.layers.") for k in renamed)
    save_file(renamed, str(tmp_path / "model.safetensors"))
    for f in ("tokenizer.json", "preprocessor_config.json"):
        (tmp_path / f).write_text((folder / f).read_text())
    img, prompt = picture(27, 37), "<image> a cat"
    a = ax.load_model(str(tmp_path), device="cpu").run(img, text=prompt, hidden=True)
    b = ax.load_model(str(folder), device="cpu").run(img, text=prompt, hidden=True)
    assert np.abs(a.attentions - b.attentions).max() == 0 and np.abs(a.hidden - b.hidden).max() == 0
    assert np.abs(a.vision_attentions - b.vision_attentions).max() == 0


@pytest.mark.parametrize("field, value, words", [
    ("rope_scaling", {"type": "mrope", "mrope_section": [2, 2, 2]}, "mrope_section must be whole numbers summing"),
    ("rope_scaling", {"type": "yarn", "factor": 2.0}, "rope type 'yarn' is not supported with M-RoPE"),
    ("vision_config", {"hidden_size": 36, "num_heads": 4, "out_hidden_size": 48}, "divisible by 4"),
    ("vision_config", {"out_hidden_size": 40}, "out_hidden_size 40 differs"),
])
def test_qwen2_5_vl_refuses_bad_fields(qwen_folder, tmp_path, field, value, words):
    from attn_explorer.errors import UserError

    _, folder = qwen_folder
    cfg = json.loads((folder / "config.json").read_text())
    if field == "vision_config":
        cfg["vision_config"] = {**cfg["vision_config"], **value}
    else:
        cfg["text_config"].pop("rope_parameters", None)
        cfg["text_config"][field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "preprocessor_config.json"):
        (tmp_path / f).write_text((folder / f).read_text())
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(UserError, match=words):
        ax.load_model(str(tmp_path), device="cpu")


def test_qwen2_5_vl_lazy_hooks_and_ablation(qwen_folder):
    """Part C: lazy maps equal the dense ones and serve image_overlay; hooks reach the decoder's blocks
    (run_with_cache); ablation switches a head off; the trace-based analyses refuse in one line."""
    from attn_explorer.api.vlm import image_overlay
    from attn_explorer.errors import UserError

    _, folder = qwen_folder
    m = ax.load_model(str(folder), device="cpu")
    img, prompt = picture(27, 37), "<image> a cat sat"
    dense = m.run(img, text=prompt)
    lazy = m.run(img, text=prompt, lazy=True)
    n = dense.num_tokens
    diff = max(np.abs(lazy.attention(i, h, rows=(0, n)) - dense.attentions[i, h]).max()
               for i in range(3) for h in range(6))
    assert diff < 1e-6, diff
    ov = image_overlay(lazy, -1)
    assert ov.views.shape == (1, 6, 10)  # 3 × 5 image tokens, each a 2 × 2 square of patches
    assert np.allclose(ov.views[0, ::2, ::2].sum(), dense.attentions[:, :, -1][..., dense.image_token_positions[:, 0]]
                       .mean((0, 1)).sum(), atol=1e-6)
    names = m.hook_names()
    assert "blocks.0.attn.hook_pattern" in names
    r, cache = m.run_with_cache(img, text=prompt, names=["blocks.1.attn.hook_pattern"])
    assert np.allclose(np.asarray(cache["blocks.1.attn.hook_pattern"])[0], dense.attentions[1], atol=1e-6)
    ablated = m.run(img, text=prompt, ablate={(0, 1): "zero"}, hidden=True)
    plain = m.run(img, text=prompt, hidden=True)
    assert np.abs(ablated.hidden - plain.hidden).max() > 1e-4
    with pytest.raises(UserError, match="qwen2_5_vl: this analysis"):
        m.trace(None)
    with pytest.raises(UserError, match="reuse_prefix is not supported yet"):
        m.run(img, text=prompt, reuse_prefix=True)
