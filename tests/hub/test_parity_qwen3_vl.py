"""Qwen3-VL against transformers eager: the vision tower (core.qwen3_vision) at module level (a tiny random
Qwen3VLVisionConfig, every weight off its init, LayerNorms and the learned position table too; pixels from
transformers' own Qwen2VL image processor): every tower map, the merged output and each DeepStack merger's output;
then the whole model through ax.load_model (interleaved M-RoPE, Qwen3 decoder, DeepStack after its first layers):
decoder maps, tower maps, hidden state within 1e-5, greedy tokens equal, lazy maps equal the dense ones."""
from __future__ import annotations

import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attn_explorer.core.qwen3_vision import QWEN3_VISION_RULES, Qwen3VisionConfig, Qwen3VisionTower  # noqa: E402
from tests.api.vlm_tiny import VISION, qwen3_vl_folder  # noqa: E402
from tests.hub.test_parity_qwen_vl import picture, processor_pixels  # noqa: E402

TOL = 1e-5


def test_qwen3_vl_tower_matches_transformers():
    from transformers.models.qwen3_vl import modeling_qwen3_vl as hf_mod

    torch.manual_seed(0)
    cfg = transformers.Qwen3VLVisionConfig(**VISION)
    cfg._attn_implementation = "eager"
    hf = hf_mod.Qwen3VLVisionModel(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours = Qwen3VisionTower(Qwen3VisionConfig(dim=32, num_layers=4, num_heads=4, mlp_hidden=40, out_dim=48,
                                              patch_size=4, merge=2, num_positions=16, deepstack=[0, 2])).eval()
    state = {}
    for k, v in hf.state_dict().items():
        for pat, rep in QWEN3_VISION_RULES:
            if re.fullmatch(pat, k):
                state[re.sub(pat, rep, k)] = v
                break
        else:
            raise AssertionError(f"unmapped {k}")
    ours.load_state_dict(state, strict=True)

    pixels, grid = processor_pixels(picture())
    got = []
    orig = hf_mod.eager_attention_forward

    def spy(module, q, *a, **kw):
        out, w = orig(module, q, *a, **kw)
        got.append(w[0])
        return out, w

    hf_mod.eager_attention_forward = spy
    try:
        with torch.no_grad():
            ref = hf(pixels, grid_thw=grid)
    finally:
        hf_mod.eager_attention_forward = orig
    with torch.no_grad():
        out = ours(pixels, tuple(grid[0].tolist()), output_attentions=True)
    maps = (out.attentions - torch.stack(got)).abs().max().item()
    merged = (out.hidden - ref.pooler_output).abs().max().item()
    blocks = (out.blocks_out - ref.last_hidden_state).abs().max().item()
    deep = max((a - b).abs().max().item() for a, b in zip(out.deepstack, ref.deepstack_features))
    print(f"qwen3_vl tower: maps {maps:.2e} merged {merged:.2e} blocks {blocks:.2e} deepstack {deep:.2e}")
    assert len(out.deepstack) == len(ref.deepstack_features) == 2
    assert maps < TOL and merged < TOL and blocks < TOL and deep < TOL


def test_qwen3_vl_parity_with_transformers(tmp_path, monkeypatch):
    """The whole Qwen3-VL through ax.load_model: interleaved M-RoPE, the Qwen3 decoder's q/k norms, DeepStack
    after its first layers; decoder maps, tower maps and hidden state within 1e-5, greedy tokens equal."""
    import numpy as np

    import attn_explorer as ax
    from attn_explorer.core.qwen_vision import patch_positions
    from tests.hub.test_parity_qwen_vl import PAD

    hf = qwen3_vl_folder(tmp_path)  # seed 7, 256 positions, max_pixels 10,000
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.info.family == "qwen3_vl"
    img, prompt = picture(27, 37), "the cat <image> sat on"
    prep = m.prepare(img, text=prompt)
    ids, (patches, grid) = prep.inputs["input_ids"], prep.inputs["pixels"]
    assert list(grid) == [1, 6, 10]
    r = m.run(img, text=prompt, hidden=True)
    thw, mm = torch.tensor([list(grid)]), (ids == PAD).int()
    from transformers.models.qwen3_vl import modeling_qwen3_vl as hf_mod

    got = []
    orig = hf_mod.eager_attention_forward

    def spy(module, q, *a, **kw):
        out, w = orig(module, q, *a, **kw)
        if isinstance(module, hf_mod.Qwen3VLVisionAttention):
            got.append(w[0])
        return out, w

    hf_mod.eager_attention_forward = spy
    try:
        with torch.no_grad():
            ref = hf.model(input_ids=ids, pixel_values=patches, image_grid_thw=thw, mm_token_type_ids=mm,
                           output_attentions=True)
    finally:
        hf_mod.eager_attention_forward = orig
    pos = patch_positions(tuple(grid), 2)
    order = torch.argsort(pos[:, 0] * 10 + pos[:, 1])
    tower = torch.stack(got)[:, :, order][..., order]
    dec = max(np.abs(r.attentions[i] - a[0].numpy()).max() for i, a in enumerate(ref.attentions))
    vis = np.abs(r.vision_attentions[0] - tower.numpy()).max()
    hid = np.abs(r.hidden - ref.last_hidden_state[0].numpy()).max()
    print(f"qwen3_vl: decoder maps {dec:.2e} tower maps {vis:.2e} hidden {hid:.2e}")
    assert len(ref.attentions) == r.attentions.shape[0] == 3
    assert dec <= TOL and vis <= TOL and hid <= TOL
    g = m.generate(img, text=prompt, max_new_tokens=6)
    with torch.no_grad():
        out = hf.generate(input_ids=ids, pixel_values=patches, image_grid_thw=thw, mm_token_type_ids=mm,
                          max_new_tokens=6, do_sample=False)
    assert g.ids == out[0, ids.shape[1]:].tolist()
    # lazy maps equal the dense ones (DeepStack rides the same hooks as the kept q and k)
    lazy = m.run(img, text=prompt, lazy=True)
    n = r.num_tokens
    assert max(np.abs(lazy.attention(i, h, rows=(0, n)) - r.attentions[i, h]).max()
               for i in range(3) for h in range(6)) < 1e-6
    # DeepStack matters here: without it the hidden state is far off
    from attn_explorer.core.vlm import VisionLanguage

    monkeypatch.setattr(VisionLanguage, "deepstack_hooks", lambda self, place, hooks: hooks)
    off = m.run(img, text=prompt, hidden=True)
    print(f"qwen3_vl without DeepStack: hidden {np.abs(off.hidden - r.hidden).max():.2e}")
    assert np.abs(off.hidden - r.hidden).max() > 1e-2


def test_qwen3_vl_hub_checkpoint_form(tmp_path):
    """Part D: the config.json Qwen3-VL-2B-Instruct ships (text_config with legacy rope_scaling {mrope_interleaved,
    mrope_section, rope_type} and rope_theta, its vision_config keys, dtype, architectures), shrunk to tiny sizes,
    with a tiny state dict under the hub's names (model.visual.*, model.language_model.*, lm_head): it loads and
    runs, the DeepStack mergers and q/k norms all read."""
    import json

    from safetensors.torch import save_file

    import attn_explorer as ax
    from tests.hub.test_parity_qwen_vl import PAD, tokenizer

    real = {"architectures": ["Qwen3VLForConditionalGeneration"], "image_token_id": PAD, "model_type": "qwen3_vl",
            "text_config": {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "dtype": "bfloat16",
                            "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu", "hidden_size": 48,
                            "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 256,
                            "model_type": "qwen3_vl_text", "num_attention_heads": 6, "num_hidden_layers": 2,
                            "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
                            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [2, 1, 1],
                                             "rope_type": "default"},
                            "rope_theta": 5000000, "tie_word_embeddings": True, "use_cache": True, "vocab_size": 304},
            "tie_word_embeddings": True, "transformers_version": "4.57.0.dev0", "video_token_id": 303,
            "vision_config": {"deepstack_visual_indexes": [0, 2], "depth": 4, "hidden_act": "gelu_pytorch_tanh",
                              "hidden_size": 32, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 40,
                              "model_type": "qwen3_vl", "num_heads": 4, "num_position_embeddings": 16,
                              "out_hidden_size": 48, "patch_size": 4, "spatial_merge_size": 2,
                              "temporal_patch_size": 2},
            "vision_end_token_id": 302, "vision_start_token_id": 301}
    (tmp_path / "config.json").write_text(json.dumps(real))
    torch.manual_seed(0)
    hf_cfg = transformers.Qwen3VLConfig(**{k: v for k, v in real.items() if k not in ("architectures", "model_type")})
    hf = transformers.Qwen3VLForConditionalGeneration(hf_cfg)
    state = {k: v.detach().clone() for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied
    assert any(k.startswith("model.visual.deepstack_merger_list.") for k in state)
    assert any(k.endswith("self_attn.q_norm.weight") for k in state)
    save_file(state, str(tmp_path / "model.safetensors"))
    tokenizer().save(str(tmp_path / "tokenizer.json"))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.info.family == "qwen3_vl" and m.module.cfg.mrope_interleaved and m.module.cfg.text.rope_theta == 5e6
    r = m.run(picture(40, 40), text="a cat")
    assert r.attentions.shape[:2] == (2, 6) and r.vision_attentions.shape[:3] == (1, 4, 4)
