"""Qwen2.5-VL against transformers eager: tiny random configs built here, images made here, every weight moved
off its init (norms too). The vision tower (core.qwen_vision: 3-D patch conv, 2-D RoPE, windowed and full
attention blocks, the patch merger) at module level: every tower map (transformers runs each window alone in its
window order; its maps are put back in the processor's patch order) and the merged output within 1e-5."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from attn_explorer.core.qwen_vision import QWEN_VISION_RULES, QwenVisionConfig, QwenVisionTower  # noqa: E402

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
