"""Qwen3-VL's vision tower (core.qwen3_vision) against transformers eager at module level: a tiny random
Qwen3VLVisionConfig, every weight off its init (LayerNorms and the learned position table too), a picture made
here through transformers' own Qwen2VL image processor (patch 4, merge 2): every tower map, the merged output
and each DeepStack merger's output within 1e-5. The whole Qwen3-VL model is refused by the loader (see
tests/hub/test_parity_qwen_vl.py)."""
from __future__ import annotations

import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attn_explorer.core.qwen3_vision import QWEN3_VISION_RULES, Qwen3VisionConfig, Qwen3VisionTower  # noqa: E402
from tests.hub.test_parity_qwen_vl import picture, processor_pixels  # noqa: E402

TOL = 1e-5
VISION = dict(depth=4, hidden_size=32, intermediate_size=40, num_heads=4, out_hidden_size=48, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0, 2],
              hidden_act="gelu_pytorch_tanh")


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


def test_qwen3_vl_folder_refused_in_one_line(tmp_path):
    import json

    import attn_explorer as ax
    from attn_explorer.errors import UserError

    cfg = transformers.Qwen3VLConfig(vision_config=VISION, text_config=dict(
        vocab_size=304, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, head_dim=8, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                            "mrope_section": [2, 1, 1], "mrope_interleaved": True}))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    with pytest.raises(UserError, match=r"qwen3_vl is not supported yet: .*DeepStack.*interleaved M-RoPE") as e:
        ax.load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(e.value)
