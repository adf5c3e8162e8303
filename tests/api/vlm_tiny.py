"""Tiny random Qwen3-VL folders (transformers' own classes, every weight moved off its init, saved and read back
by ax.load_model) for the vision-language analyses' tests and benchmarks/bench_vlm.py. With the defaults, the
very folder tests/hub/test_parity_qwen3_vl.py checks against transformers; `max_pixels` and `positions` open it
to large pictures."""
from __future__ import annotations

import torch

VISION = dict(depth=4, hidden_size=32, intermediate_size=40, num_heads=4, out_hidden_size=48, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0, 2],
              hidden_act="gelu_pytorch_tanh")


def qwen3_vl_folder(folder, max_pixels: int = 10_000, positions: int = 256, seed: int = 7):
    """Write a tiny Qwen3-VL (3 decoder layers, 6 heads, 2 key/value heads, DeepStack after layers 0 and 1) to
    folder; returns transformers' model (eager attention) for references."""
    import transformers

    from tests.hub.test_parity_qwen_vl import END, PAD, START, tokenizer
    from tests.hub.tiny_vlm import eager_perturbed, save_folder

    torch.manual_seed(seed)
    text = dict(vocab_size=304, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=6,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=positions, rms_norm_eps=1e-6,
                bos_token_id=1, eos_token_id=2, pad_token_id=0,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                 "mrope_interleaved": True})
    cfg = transformers.Qwen3VLConfig(vision_config=VISION, text_config=text, image_token_id=PAD,
                                     vision_start_token_id=START, vision_end_token_id=END, tie_word_embeddings=False)
    hf = eager_perturbed(transformers.Qwen3VLForConditionalGeneration, cfg)
    save_folder(hf, folder, tokenizer(), {"min_pixels": 64, "max_pixels": max_pixels, "image_mean": [0.5] * 3,
                                          "image_std": [0.5] * 3})
    return hf
