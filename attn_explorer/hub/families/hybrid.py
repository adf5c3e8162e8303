"""Hybrid decoders (core.hybrid): Qwen3.5 (qwen3_5_text, and the language model of the multimodal qwen3_5) and
Qwen3-Next (qwen3_next, with MoE and a gated shared expert): Gated DeltaNet on the "linear_attention" layers, gated
softmax attention with QK-norm and partial RoPE on the "full_attention" ones, (1 + w) RMSNorms."""
from __future__ import annotations

from dataclasses import fields

from attn_explorer.core.deltanet import DeltaNetConfig
from attn_explorer.core.hybrid import HybridConfig, HybridDecoder
from attn_explorer.core.llama import LlamaConfig
from attn_explorer.core.moe import MoEConfig
from attn_explorer.errors import UserError
from attn_explorer.hub.families.common import ARCHITECTURES, B as _B, Architecture, norm_eps
from attn_explorer.hub.families.decoders import QWEN3_RULES, ROPE_BUFFERS, rotary_decoder
from attn_explorer.hub.families.moe import flag, moe_layers_every, num_experts, whole

_KINDS = {"linear_attention": "deltanet", "full_attention": "softmax"}


def _layer_mixers(cfg: dict, family: str) -> list[str]:
    """layer_types ('linear_attention' / 'full_attention' per layer), or transformers' default: every
    full_attention_interval-th layer softmax."""
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        every = whole(cfg, family, "full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n:
        raise UserError(f"{family}: layer_types must list one kind per layer ({n}), got {types!r}")
    bad = sorted({str(t) for t in types} - set(_KINDS))
    if bad:
        raise UserError(f"{family}: layer type {bad[0]!r} is not supported (only linear_attention and full_attention)")
    return [_KINDS[t] for t in types]


def _qwen3_hybrid(cfg: dict, family: str, layout: str, moe: MoEConfig | None = None,
                  moe_layers: list | None = None) -> HybridConfig:
    if cfg.get("hidden_act", "silu") != "silu":
        raise UserError(f"{family}: hidden_act {cfg.get('hidden_act')!r} is not supported (only silu)")
    dn = DeltaNetConfig(
        num_k_heads=whole(cfg, family, "linear_num_key_heads", 16),
        num_v_heads=whole(cfg, family, "linear_num_value_heads", 32),
        head_k_dim=whole(cfg, family, "linear_key_head_dim", 128),
        head_v_dim=whole(cfg, family, "linear_value_head_dim", 128),
        conv_kernel=whole(cfg, family, "linear_conv_kernel_dim", 4), eps=norm_eps(cfg, "rms_norm_eps", 1e-6),
        layout=layout, family=family)
    if dn.num_v_heads % dn.num_k_heads:
        raise UserError(f"{family}: linear_num_value_heads ({dn.num_v_heads}) is not a multiple of "
                        f"linear_num_key_heads ({dn.num_k_heads})")
    cfg = {"head_dim": 256, "num_key_value_heads": 2 if family == "qwen3_next" else 4, **cfg}
    base = rotary_decoder(cfg, family, rope_defaults=dict(fraction=0.25), norm="rms1p", qk_norm=True,
                          attention_bias=bool(cfg.get("attention_bias", False)), moe=moe, moe_layers=moe_layers)
    return HybridConfig(**{f.name: getattr(base, f.name) for f in fields(LlamaConfig)},
                        layer_mixers=_layer_mixers(cfg, family), mixer_configs={"deltanet": dn}, output_gate=True)


def _qwen3_5_config(cfg: dict) -> HybridConfig:
    if cfg.get("model_type") == "qwen3_5":  # the multimodal config: its language model is text_config
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise UserError(f"qwen3_5: the multimodal config needs a text_config object, got {text!r}")
        cfg = {"tie_word_embeddings": cfg.get("tie_word_embeddings", False), **text}
    return _qwen3_hybrid(cfg, "qwen3_5_text", "split")


def _qwen3_next_config(cfg: dict) -> HybridConfig:
    f = "qwen3_next"
    experts = num_experts(cfg, f, 512)
    moe, layers = None, None
    if experts:
        k = whole(cfg, f, "num_experts_per_tok", 10)
        if k > experts:
            raise UserError(f"{f}: num_experts_per_tok ({k}) is more than num_experts ({experts})")
        shared = whole(cfg, f, "shared_expert_intermediate_size", 512, low=0)
        moe = MoEConfig(num_experts=experts, top_k=k, hidden=whole(cfg, f, "moe_intermediate_size", 512),
                        scoring="softmax", norm_topk=flag(cfg, f, "norm_topk_prob", True), shared_hidden=shared,
                        shared_gate=shared > 0)
        layers = moe_layers_every(cfg, f, whole(cfg, f, "decoder_sparse_step", 1), cfg.get("mlp_only_layers") or [])
    return _qwen3_hybrid(cfg, f, "next", moe if layers and any(layers) else None,
                         layers if layers and any(layers) else None)


_LL = r"layers\.(\d+)\."
_LA = _LL + r"linear_attn\."
QWEN3_5_RULES = QWEN3_RULES + [
    (_LA + r"(in_proj_qkv|in_proj_z|in_proj_b|in_proj_a|in_proj_qkvz|in_proj_ba|out_proj)\.weight",
     _B + r"attn.\2.weight"),
    (_LA + r"conv1d\.weight", _B + r"attn.conv1d.weight"),
    (_LA + r"(dt_bias|A_log)", _B + r"attn.\2"),
    (_LA + r"norm\.weight", _B + r"attn.norm.weight"),
]
QWEN3_NEXT_RULES = QWEN3_5_RULES + [
    (_LL + r"mlp\.gate\.weight", _B + r"mlp.router.weight"),
    (_LL + r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", _B + r"mlp.experts.\2.\3.weight"),
    (_LL + r"mlp\.shared_expert\.(gate|up|down)_proj\.weight", _B + r"mlp.shared.\2.weight"),
    (_LL + r"mlp\.shared_expert_gate\.weight", _B + r"mlp.shared_gate.weight"),
]

_MTP = r"mtp\..*"  # the multi-token-prediction head the hub's checkpoints carry; transformers does not load it
ARCHITECTURES.update({
    "qwen3_5_text": Architecture("qwen3_5_text", "text", HybridDecoder, _qwen3_5_config, QWEN3_5_RULES, ("model.",),
                                 ignore=(_MTP, *ROPE_BUFFERS)),
    # the multimodal checkpoint (Qwen3_5ForConditionalGeneration): its language model only
    "qwen3_5": Architecture(
        "qwen3_5_text", "text", HybridDecoder, _qwen3_5_config, QWEN3_5_RULES,
        ("model.language_model.", "language_model.model.", "language_model.", "model."),
        ignore=(r"(model\.)?visual\..*", _MTP, *ROPE_BUFFERS),
        note="Qwen3.5's language model only: the vision tower is not loaded"),
    "qwen3_next": Architecture("qwen3_next", "text", HybridDecoder, _qwen3_next_config, QWEN3_NEXT_RULES,
                               ("model.",), ignore=(_MTP, *ROPE_BUFFERS)),
})
