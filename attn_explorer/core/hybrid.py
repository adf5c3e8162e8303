"""Hybrid decoders: the Llama-style decoder whose layers are softmax attention or a recurrent mixer, layer by layer
(core.recurrent's interface). Qwen3.5 and Qwen3-Next: Gated DeltaNet (core.deltanet) on their "linear_attention"
layers, gated softmax attention (output_gate, QK-norm, partial RoPE) on the others, (1 + w) RMSNorms.

HybridConfig.layer_mixers names each layer's mixer ("softmax" or a recurrent kind) and mixer_configs gives each
recurrent kind's config (anything with build(dim) -> a core.recurrent.RecurrentMixer), so another recurrent family
(Mamba-2) is a new kind here, not a new decoder.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from attn_explorer.core.attention import KVCache
from attn_explorer.core.blocks import BlockConfig
from attn_explorer.core.deltanet import DeltaNetConfig
from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.recurrent import MIXER_WORDS, RecurrentState

_MIXER_CONFIGS = {"deltanet": DeltaNetConfig}  # a stored checkpoint config's plain dicts -> these


@dataclass
class HybridConfig(LlamaConfig):
    """LlamaConfig (its attention fields describe the softmax layers) and, per layer, its mixer."""

    layer_mixers: list | None = None  # per layer "softmax" or a recurrent kind ("deltanet", ...); None: all softmax
    mixer_configs: dict | None = None  # recurrent kind -> its layers' config (DeltaNetConfig, ...)
    output_gate: bool = False  # the softmax layers' heads times sigmoid(gate) from q_proj's second half (Qwen3.5)

    def __post_init__(self):
        super().__post_init__()
        for kind, c in (self.mixer_configs or {}).items():
            if isinstance(c, dict):
                self.mixer_configs[kind] = _MIXER_CONFIGS[kind](**c)

    def mixer(self, layer: int) -> str:
        return self.layer_mixers[layer] if self.layer_mixers else "softmax"

    def block(self, layer: int) -> BlockConfig:
        kind = self.mixer(layer)
        c = super().block(layer)
        if kind == "softmax":
            return replace(c, output_gate=self.output_gate)
        return replace(c, mixer=self.mixer_configs[kind])

    def mixers(self) -> list[str]:
        """ModelInfo.mixers: per layer its kind."""
        return [self.mixer(i) for i in range(self.num_layers)]

    def layer_heads(self) -> list[int]:
        """ModelInfo.layer_heads: per layer how many heads its maps have (a recurrent layer's own)."""
        return [self.num_heads if k == "softmax" else self.mixer_configs[k].map_heads() for k in self.mixers()]

    def layer_kinds(self) -> list[str]:
        """'gated DeltaNet (implicit)' on a recurrent layer, 'softmax, global' (or its window) on the others."""
        kinds = super().layer_kinds()
        return [f"softmax, {w}" if m == "softmax" else MIXER_WORDS[m] for m, w in zip(self.mixers(), kinds)]


class HybridDecoder(Llama):
    """Llama with recurrent mixers on some layers; its cache holds a RecurrentState in those layers' slots."""

    def new_cache(self) -> KVCache:
        cache = KVCache(self.cfg.num_layers)
        for i, kind in enumerate(self.cfg.mixers()):
            if kind != "softmax":
                cache.layers[i] = RecurrentState()
        return cache
