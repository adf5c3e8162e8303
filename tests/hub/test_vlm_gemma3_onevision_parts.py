"""Gemma 3 multimodal and LLaVA OneVision beyond parity. Part C: the decoder's hook points, run_with_cache, ablation,
lazy maps equal to the dense ones (Gemma 3's per-layer masks: the image run both ways, the local layers' window),
the image overlay, and prefix reuse refused in one line naming the family. Part D: the config.json the hub's
checkpoints ship (google/gemma-3-4b-it, llava-hf/llava-onevision-qwen2-0.5b-ov-hf), read as transformers reads it,
then shrunk (the same keys, tiny sizes, legacy rope fields as written) with a tiny state dict under the checkpoint's
own tensor names and dtype, loaded and run on a picture against transformers."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity_vlm import TOL, legacy_name, picture  # noqa: E402
from tests.hub.test_parity_vlm_gemma3_onevision import (BOI, EOI, ONE_IMAGE, SOFT, VOCAB, built,  # noqa: E402,F401
                                                        gemma_tokenizer, hf_inputs)


@pytest.mark.parametrize("name", ["gemma3", "llava_onevision"])
def test_hooks_ablation_lazy_and_refusals(built, name):  # noqa: F811
    from attn_explorer.api.vlm import image_overlay

    _, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    names = m.hook_names()
    assert "blocks.2.attn.hook_pattern" in names and "hook_logits" in names
    r, cache = m.run_with_cache(picture(), text="cat", names=["blocks.1.attn.hook_pattern", "blocks.0.hook_resid_post"])
    assert np.allclose(cache["blocks.1.attn.hook_pattern"][0].numpy(), r.attentions[1], atol=1e-7)
    off = m.run(picture(), text="cat", ablate={(0, 1): "zero"}, hidden=True)
    assert np.array_equal(off.attentions[0], r.attentions[0])  # layer 0's maps come before its W_O
    assert np.abs(off.attentions[1] - r.attentions[1]).max() > 1e-4
    lazy = m.run(picture(), text="cat", lazy=True)
    assert lazy.is_lazy
    L, H = r.attentions.shape[:2]
    worst = max(np.abs(lazy.attention(i, h) - r.attentions[i, h]).max() for i in range(L) for h in range(H))
    print(f"{name}: lazy maps off the dense ones by {worst:.1e}")
    assert worst <= 1e-6, worst
    dense, kept = image_overlay(r, -1), image_overlay(lazy, -1)
    assert np.allclose(kept.picture, dense.picture, atol=1e-6)
    pos = r.image_token_positions
    if name == "gemma3":  # 4 × 4 image tokens, each a 2 × 2 square of patches
        assert dense.views.shape == (1, 8, 8) and dense.cls == 0
    else:  # the canvas (6 × 8, tile 0) is the picture; the base view (4 × 4) beside it; newline tokens apart
        row = r.attentions[:, :, -1].mean((0, 1))
        canvas = pos[(pos[:, 1] == 0) & (pos[:, 3] >= 0)]
        assert dense.views.shape == (2, 6, 8) and dense.picture.shape == (6, 8)
        assert np.allclose(dense.picture[canvas[:, 2], canvas[:, 3]], row[canvas[:, 0]], atol=1e-6)
        assert np.allclose(dense.views[1][:4, :4].ravel(), row[pos[:16, 0]], atol=1e-6)
        newline = pos[pos[:, 3] < 0, 0]
        assert len(newline) == 6 and np.isclose(dense.cls, r.attentions[:, :, -1][..., newline].sum(-1).mean())
    with pytest.raises(UserError, match=f"{name}: reuse_prefix is not supported yet"):
        m.run(picture(), text="cat", reuse_prefix=True)


# Part D. google/gemma-3-4b-it's config.json as the hub ships it: text_config names only what differs from
# Gemma3TextConfig's defaults, legacy rope_scaling (linear 8 on the global layers), a two-id eos
GEMMA3_4B = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
             "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02,
             "mm_tokens_per_image": 256, "model_type": "gemma3",
             "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                             "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                             "sliding_window": 1024},
             "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
             "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                               "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                               "patch_size": 14, "vision_use_head": False}}
# llava-hf/llava-onevision-qwen2-0.5b-ov-hf: a Qwen2-0.5B decoder (legacy rope_theta, its own tie flag), siglip-so400m
ONEVISION_05B = {
    "architectures": ["LlavaOnevisionForConditionalGeneration"],
    "image_grid_pinpoints": [[384 * r, 384 * c] for r in range(1, 7) for c in range(1, 7)],
    "image_token_index": 151646, "model_type": "llava_onevision", "projector_hidden_act": "gelu",
    "text_config": {"_name_or_path": "Qwen/Qwen2-0.5B-Instruct", "architectures": ["Qwen2ForCausalLM"],
                    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_size": 896, "intermediate_size": 4864,
                    "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
                    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
                    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
                    "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 152000},
    "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.45.0.dev0",
    "use_image_newline_parameter": True, "video_token_index": 151647, "vision_aspect_ratio": "anyres_max_9",
    "vision_config": {"hidden_size": 1152, "image_size": 384, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 26,
                      "patch_size": 14, "vision_use_head": False},
    "vision_feature_layer": -1, "vision_feature_select_strategy": "full"}
REAL = {"gemma-3-4b": GEMMA3_4B, "llava-onevision-0.5b": ONEVISION_05B}


def shrunk(real: str) -> dict:
    """The real config.json read as transformers reads it, then a copy with the same keys, sizes made tiny."""
    from attn_explorer.hub.convert import architecture_for, translate_config

    raw = REAL[real]
    cfg = translate_config(architecture_for(raw, real), raw, real)
    hf = getattr(transformers, "Gemma3Config" if real.startswith("gemma") else "LlavaOnevisionConfig")(**raw)
    t, v = hf.text_config, hf.vision_config
    assert (cfg.text.dim, cfg.text.num_layers, cfg.text.num_heads, cfg.text.num_kv_heads, cfg.text.mlp_hidden,
            cfg.text.vocab_size, cfg.text.tie_embeddings) == (t.hidden_size, t.num_hidden_layers, t.num_attention_heads,
                                                              t.num_key_value_heads, t.intermediate_size, t.vocab_size,
                                                              hf.tie_word_embeddings)
    assert (cfg.vision.dim, cfg.vision.num_layers, cfg.vision.image_size, cfg.vision.patch_size) == (
        v.hidden_size, v.num_hidden_layers, v.image_size, v.patch_size)
    assert cfg.image_token_id == hf.image_token_id
    tiny = json.loads(json.dumps(raw))
    tiny["vision_config"].update(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                 image_size=32)
    if real.startswith("gemma"):
        assert cfg.image_tokens == 256 and cfg.pool == 4 and cfg.text.sliding_windows[:6] == [1024] * 5 + [None]
        assert cfg.text.rope_linear_factor == 8.0 and cfg.text.head_dim == 256 and cfg.text_eos == (1, 106)
        tiny["text_config"].update(hidden_size=48, intermediate_size=64, num_hidden_layers=7, sliding_window=5,
                                   vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=2, head_dim=12)
        tiny["vision_config"].update(patch_size=4)
        tiny.update(mm_tokens_per_image=16, image_token_index=SOFT, boi_token_index=BOI, eoi_token_index=EOI)
    else:
        assert cfg.grid_pinpoints == raw["image_grid_pinpoints"] and cfg.max_tiles == 9 and cfg.feature_depth == 26
        assert cfg.text.rope_theta == 1e6 and cfg.text_eos == 151645
        tiny["text_config"].update(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256)
        tiny["vision_config"].update(patch_size=8)
        tiny.update(image_token_index=ONE_IMAGE, image_grid_pinpoints=[[32 * r, 32 * c] for r in range(1, 7)
                                                                       for c in range(1, 7)])
    return tiny


def checkpoint_name(key: str) -> str:
    """transformers 5's names -> the hub checkpoint's (language_model.model.*, vision_tower.*, image_newline)."""
    return "image_newline" if key == "model.image_newline" else legacy_name(key)


@pytest.mark.parametrize("real", list(REAL))
def test_real_config_json_shrunk_loads_and_runs_a_picture(real, tmp_path):
    from safetensors.torch import save_file

    tiny = shrunk(real)
    gemma = real.startswith("gemma")
    torch.manual_seed(9)
    hf_cfg = getattr(transformers, "Gemma3Config" if gemma else "LlavaOnevisionConfig")(**tiny)
    hf = getattr(transformers, "Gemma3ForConditionalGeneration" if gemma else
                 "LlavaOnevisionForConditionalGeneration")(hf_cfg).float().eval()
    hf.set_attn_implementation("eager")
    dtype = torch.bfloat16 if gemma else torch.float16
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_((p + torch.randn_like(p) * 0.1).to(dtype).float())  # what the stored tensors hold
    tied = hf_cfg.tie_word_embeddings
    sd = {checkpoint_name(k): v.to(dtype).contiguous() for k, v in hf.state_dict().items()
          if not (k == "lm_head.weight" and tied)}
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(tiny))
    gemma_tokenizer().save(str(tmp_path / "tokenizer.json"))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.info.family == ("gemma3" if gemma else "llava_onevision") and m.info.num_layers == (7 if gemma else 2)
    prep = m.prepare(picture(), text="the cat")
    r = m.run(picture(), text="the cat", hidden=True)
    with torch.no_grad():
        ref = hf.model(output_attentions=True, **hf_inputs("gemma3" if gemma else "llava_onevision", prep))
    dec = max(np.abs(r.attentions[i] - a[0].numpy()).max() for i, a in enumerate(ref.attentions))
    hid = np.abs(r.hidden - ref.last_hidden_state[0].numpy()).max()
    print(f"{real} (shrunk, {dtype} tensors): decoder maps {dec:.2e} hidden {hid:.2e}")
    assert dec <= TOL and hid <= TOL


@pytest.mark.parametrize("name", ["gemma3", "llava_onevision"])
def test_relevance_reaches_the_picture(built, name):  # noqa: F811
    """Part C: relevance (analysis.relevance_vlm: gradient rollout and AttnLRP) over the image and text tokens, through
    Gemma 3's two-way image mask and OneVision's canvas, the image tokens put on the picture."""
    from attn_explorer.analysis.relevance_vlm import explain_picture, picture_relevance

    _, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    for method in ("gradient_rollout", "attnlrp"):
        rel = explain_picture(m, (picture(), "the cat"), method)
        pos = rel.image_token_positions
        assert np.isfinite(rel.scores).all() and np.abs(rel.scores[pos[:, 0]]).sum() > 0
        assert picture_relevance(rel).shape == ((8, 8) if name == "gemma3" else (6, 8))
