"""The architecture table: one row per Hugging Face model_type, kept in one module per kind of family
(LitGPT's config.py: a new family is a row, plus at most a new field in core).

A row says how config.json becomes our config (through the shared readers in `common`), which of our
models to build, and how the checkpoint's tensor names map onto ours (regex -> our name), with the
task-head prefixes to strip and the keys knowingly left out. The generic conversion that uses the rows
lives in hub/convert.py.
"""
from __future__ import annotations

from attn_explorer.hub.families import (clip, decoders, encoders, gemma, modernbert, olmo, seq2seq,  # noqa: F401 - rows
                                      vision)
from attn_explorer.hub.families import glm_cohere  # noqa: F401 - rows (GLM-4, Cohere, Cohere 2)
from attn_explorer.hub.families import gemma4  # noqa: F401 - rows (Gemma 4: gemma4_text, gemma4)
from attn_explorer.hub.families import gpt_oss  # noqa: F401 - rows (gpt-oss)
from attn_explorer.hub.families import llama4  # noqa: F401 - rows (Llama 4)
from attn_explorer.hub.families import moe  # noqa: F401 - rows (Qwen3-MoE)
from attn_explorer.hub.families import deepseek  # noqa: F401 - rows (DeepSeek-V3)
from attn_explorer.hub.families import hybrid  # noqa: F401 - rows (Qwen3.5, Qwen3-Next: Gated DeltaNet hybrids)
from attn_explorer.hub.families import mamba  # noqa: F401 - rows (Granite 4 hybrid, Falcon-H1: Mamba-2)
from attn_explorer.hub.families import vlm  # noqa: F401 - rows (LLaVA, PaliGemma: image and text)
from attn_explorer.hub.families import vlm_gemma3, vlm_onevision  # noqa: F401 - rows (Gemma 3, LLaVA OneVision)
from attn_explorer.hub.families.common import ACTS, ARCHITECTURES, Architecture

__all__ = ["ACTS", "ARCHITECTURES", "Architecture"]
