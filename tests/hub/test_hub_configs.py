"""Issue 23 part D: a hub folder as a user has it. Each row writes the config.json a real hub checkpoint of
its family ships (the same keys and value types: architectures, model_type, torch_dtype, transformers_version,
legacy rope_scaling, bos/eos ids, ...; no quantization_config), shrunk only in its sizes (widths, layers,
heads, vocabulary, windows), next to a tiny random state dict under the checkpoint's real tensor names
(transformers' model built from that very config, every weight moved off its init, saved in the dtype the
real checkpoint is stored in), and loads it through `ax.load_model`. transformers reads the same folder
(eager attention, float32) as the reference: the maps and last hidden state agree within 1e-5.

Values are written from the real files as we know them; where we are not sure of one, the key is kept
and a comment says so. Token ids larger than the tiny vocabulary are shrunk into it (the real id in a comment).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from tests.hub.test_parity_rotary_families import TOL, max_differences, per_name  # noqa: E402
from tests.tiny_llama import train_tokenizer  # noqa: E402

N = 21  # tokens per test sequence: longer than every shrunk window below
VOCAB = 300  # train_tokenizer's vocabulary


def _n(flags: list, n: int) -> list:
    """A per-layer pattern repeated to n layers (the real file's list, shrunk)."""
    return [flags[i % len(flags)] for i in range(n)]


@dataclass
class Row:
    real: str  # the hub checkpoint whose config.json this mimics
    config: dict
    kinds: list = field(default_factory=list)  # ModelInfo.layer_kinds expected ([] when every layer is plain global)
    weights: str = "bfloat16"  # the dtype the real checkpoint's tensors are stored in
    family: str = ""  # ModelInfo.family where it is not the model_type (Gemma 3's multimodal checkpoints)
    rename: tuple = ()  # (prefix transformers 5 saves, the prefix the real checkpoint's tensors carry)


LLAMA31 = dict(  # meta-llama/Llama-3.1-8B-Instruct
    architectures=["LlamaForCausalLM"], attention_bias=False, attention_dropout=0.0,
    bos_token_id=1,  # real 128000
    eos_token_id=[2, 0, 1],  # real [128001, 128008, 128009]
    hidden_act="silu", hidden_size=48, initializer_range=0.02, intermediate_size=64,
    max_position_embeddings=131072, mlp_bias=False, model_type="llama", num_attention_heads=6,
    num_hidden_layers=3, num_key_value_heads=2, pretraining_tp=1, rms_norm_eps=1e-05,
    rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    rope_theta=500000.0, tie_word_embeddings=False, torch_dtype="bfloat16", transformers_version="4.43.0.dev0",
    use_cache=True, vocab_size=VOCAB)

LLAMA32 = dict(  # meta-llama/Llama-3.2-1B: head_dim written out, tied embeddings, factor 32
    LLAMA31, eos_token_id=2,  # real 128001
    head_dim=8, rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                              "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    tie_word_embeddings=True, transformers_version="4.45.0.dev0")

QWEN25_YARN = dict(  # Qwen/Qwen2.5-7B-Instruct, with the model card's YaRN block added for long inputs
    architectures=["Qwen2ForCausalLM"], attention_dropout=0.0,
    bos_token_id=1, eos_token_id=2,  # real 151643, 151645
    hidden_act="silu", hidden_size=48, initializer_range=0.02, intermediate_size=64, max_position_embeddings=32768,
    max_window_layers=3,  # real 28 (= its layers)
    model_type="qwen2", num_attention_heads=6, num_hidden_layers=3, num_key_value_heads=2, rms_norm_eps=1e-06,
    rope_theta=1000000.0, rope_scaling={"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
    sliding_window=131072, tie_word_embeddings=False, torch_dtype="bfloat16", transformers_version="4.43.1",
    use_cache=True, use_sliding_window=False, vocab_size=VOCAB)

# Phi-3.5-mini's 48 short/long factors (head_dim 96), shrunk to 4 (head_dim 8): the real lists' shape of values
_PHI35_SHORT = [1.0, 1.0199999809265137, 1.1399999856948853, 1.5099999904632568]  # values: ours, unsure
_PHI35_LONG = [1.0800000429153442, 1.2300000190734863, 3.8100000381469727, 11.5]  # values: ours, unsure
PHI35 = dict(  # microsoft/Phi-3.5-mini-instruct
    architectures=["Phi3ForCausalLM"], attention_bias=False, attention_dropout=0.0,
    auto_map={"AutoConfig": "configuration_phi3.Phi3Config", "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
    bos_token_id=1, embd_pdrop=0.0, eos_token_id=2,  # real 32000
    hidden_act="silu", hidden_size=48, initializer_range=0.02, intermediate_size=64,
    max_position_embeddings=131072, model_type="phi3", num_attention_heads=6, num_hidden_layers=3,
    num_key_value_heads=6, original_max_position_embeddings=4096, pad_token_id=2,  # real 32000
    resid_pdrop=0.0, rms_norm_eps=1e-05,
    rope_scaling={"long_factor": _PHI35_LONG, "short_factor": _PHI35_SHORT, "type": "longrope"},
    rope_theta=10000.0, sliding_window=262144, tie_word_embeddings=False, torch_dtype="bfloat16",
    transformers_version="4.43.3", use_cache=True, vocab_size=VOCAB)

PHI4_MINI = dict(  # microsoft/Phi-4-mini-instruct: RoPE on 3/4 of each head, tied, GQA
    architectures=["Phi3ForCausalLM"], attention_bias=False, attention_dropout=0.0,
    auto_map={"AutoConfig": "configuration_phi3.Phi3Config", "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM",
              "AutoTokenizer": "Xenova/gpt-4o"},
    bos_token_id=1, embd_pdrop=0.0, eos_token_id=2, pad_token_id=2,  # real 199999 each
    full_attn_mod=1, hidden_act="silu", hidden_size=64, initializer_range=0.02, intermediate_size=96,
    interpolate_factor=1, lm_head_bias=False, max_position_embeddings=131072, mlp_bias=False, model_type="phi3",
    num_attention_heads=4, num_hidden_layers=3, num_key_value_heads=2, original_max_position_embeddings=4096,
    partial_rotary_factor=0.75, resid_pdrop=0.0, rms_norm_eps=1e-05,
    # head_dim 16 x 0.75 = 12 rotated dims: 6 factors each (real: 48); values ours, unsure
    rope_scaling={"long_factor": [1.0, 1.118, 1.25, 1.4, 1.566, 1.75],
                  "short_factor": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0], "type": "longrope"},
    rope_theta=10000.0, sliding_window=262144, tie_word_embeddings=True, torch_dtype="bfloat16",
    transformers_version="4.45.0", use_cache=True, vocab_size=VOCAB)

MISTRAL_V01 = dict(  # mistralai/Mistral-7B-v0.1: a 4096-token window on every layer (shrunk to 6)
    architectures=["MistralForCausalLM"], bos_token_id=1, eos_token_id=2, hidden_act="silu", hidden_size=48,
    initializer_range=0.02, intermediate_size=64, max_position_embeddings=32768, model_type="mistral",
    num_attention_heads=6, num_hidden_layers=3, num_key_value_heads=2, rms_norm_eps=1e-05, rope_theta=10000.0,
    sliding_window=6, tie_word_embeddings=False, torch_dtype="bfloat16", transformers_version="4.34.0.dev0",
    use_cache=True, vocab_size=VOCAB)

MISTRAL_V03 = dict(  # mistralai/Mistral-7B-Instruct-v0.3: no window, theta 1e6
    architectures=["MistralForCausalLM"], attention_dropout=0.0, bos_token_id=1, eos_token_id=2, hidden_act="silu",
    hidden_size=48, initializer_range=0.02, intermediate_size=64, max_position_embeddings=32768,
    model_type="mistral", num_attention_heads=6, num_hidden_layers=3, num_key_value_heads=2, rms_norm_eps=1e-05,
    rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False, torch_dtype="bfloat16",
    transformers_version="4.42.0.dev0", use_cache=True, vocab_size=VOCAB)

QWEN3 = dict(  # Qwen/Qwen3-8B: head_dim written out (and wider than hidden / heads), an integer rope_theta
    architectures=["Qwen3ForCausalLM"], attention_bias=False, attention_dropout=0.0,
    bos_token_id=1, eos_token_id=2,  # real 151643, 151645
    head_dim=16, hidden_act="silu", hidden_size=48, initializer_range=0.02, intermediate_size=64,
    max_position_embeddings=40960, max_window_layers=3,  # real 36 (= its layers)
    model_type="qwen3", num_attention_heads=6, num_hidden_layers=3, num_key_value_heads=2, rms_norm_eps=1e-06,
    rope_scaling=None, rope_theta=1000000, sliding_window=None, tie_word_embeddings=False, torch_dtype="bfloat16",
    transformers_version="4.51.0", use_cache=True, use_sliding_window=False, vocab_size=VOCAB)

SMOLLM3 = dict(  # HuggingFaceTB/SmolLM3-3B: no_rope_layers lists every 4th layer as NoPE
    architectures=["SmolLM3ForCausalLM"], attention_bias=False, attention_dropout=0.0,
    bos_token_id=None,  # real: null
    eos_token_id=2, pad_token_id=0,  # real 128012, 128004
    hidden_act="silu", hidden_size=48, initializer_range=0.02, intermediate_size=64,
    layer_types=["full_attention"] * 8,  # unsure whether the real file lists layer_types (all full if so)
    max_position_embeddings=65536, max_window_layers=8,  # real 28; unsure
    mlp_bias=False, model_type="smollm3", no_rope_layer_interval=4, no_rope_layers=_n([1, 1, 1, 0], 8),
    num_attention_heads=6, num_hidden_layers=8, num_key_value_heads=2, pretraining_tp=2, rms_norm_eps=1e-06,
    rope_scaling=None, rope_theta=5000000.0, sliding_window=None, tie_word_embeddings=True, torch_dtype="bfloat16",
    transformers_version="4.54.0.dev0", use_cache=False, use_sliding_window=False, vocab_size=VOCAB)

GRANITE = dict(  # ibm-granite/granite-3.1-8b-instruct: the four multipliers
    architectures=["GraniteForCausalLM"], attention_bias=False,
    attention_dropout=0.1,  # unsure (0.0 or 0.1); dropout is off in eval either way
    attention_multiplier=0.0078125, bos_token_id=0, embedding_multiplier=12.0, eos_token_id=0, hidden_act="silu",
    hidden_size=48, initializer_range=0.02, intermediate_size=64, logits_scaling=16.0,
    max_position_embeddings=131072, mlp_bias=False, model_type="granite", num_attention_heads=6,
    num_hidden_layers=3, num_key_value_heads=2, pad_token_id=0, residual_multiplier=0.22, rms_norm_eps=1e-05,
    rope_scaling=None, rope_theta=10000000.0, tie_word_embeddings=True, torch_dtype="bfloat16",
    transformers_version="4.47.0", use_cache=True, vocab_size=VOCAB)

OLMO2 = dict(  # allenai/OLMo-2-1124-7B: stored in float32, integer rope_theta
    architectures=["Olmo2ForCausalLM"], attention_bias=False, attention_dropout=0.0,
    eos_token_id=2, pad_token_id=0,  # real 100257, 100277 (and no bos_token_id, unsure)
    hidden_act="silu", hidden_size=48, initializer_range=0.02, intermediate_size=64, max_position_embeddings=4096,
    model_type="olmo2", num_attention_heads=6, num_hidden_layers=3, num_key_value_heads=6, rms_norm_eps=1e-06,
    rope_scaling=None, rope_theta=500000, tie_word_embeddings=False, torch_dtype="float32",
    transformers_version="4.47.0.dev0", use_cache=True, vocab_size=VOCAB)

OLMO3 = dict(  # allenai/Olmo-3-1025-7B: 3 sliding layers to 1 full, YaRN on the full layers (legacy rope_scaling)
    architectures=["Olmo3ForCausalLM"], attention_bias=False, attention_dropout=0.0,
    eos_token_id=2, pad_token_id=0,  # real 100257, 100277
    hidden_act="silu", hidden_size=48, initializer_range=0.02, intermediate_size=64,
    layer_types=_n(["sliding_attention"] * 3 + ["full_attention"], 4), max_position_embeddings=65536,
    model_type="olmo3", num_attention_heads=6, num_hidden_layers=4, num_key_value_heads=6, rms_norm_eps=1e-06,
    # unsure of the exact numbers; the real file's keys are these (YaRN stretching 8192 to 65536)
    rope_scaling={"attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1, "factor": 8.0,
                  "original_max_position_embeddings": 8192, "rope_type": "yarn"},
    rope_theta=500000, sliding_window=5,  # real 4096
    tie_word_embeddings=False, torch_dtype="bfloat16", transformers_version="4.57.0", use_cache=True,
    vocab_size=VOCAB)

MODERNBERT = dict(  # answerdotai/ModernBERT-base: global every 3rd layer, 128-token local windows (shrunk to 6)
    architectures=["ModernBertForMaskedLM"], attention_bias=False, attention_dropout=0.0,
    bos_token_id=2, cls_token_id=2, eos_token_id=3, sep_token_id=3, pad_token_id=0,  # real 50281, 50282, 50283
    classifier_activation="gelu", classifier_bias=False, classifier_dropout=0.0, classifier_pooling="mean",
    decoder_bias=True, deterministic_flash_attn=False, embedding_dropout=0.0, global_attn_every_n_layers=3,
    global_rope_theta=160000.0, gradient_checkpointing=False, hidden_activation="gelu", hidden_size=32,
    initializer_cutoff_factor=2.0, initializer_range=0.02, intermediate_size=24, layer_norm_eps=1e-05,
    local_attention=6, local_rope_theta=10000.0, max_position_embeddings=8192, mlp_bias=False, mlp_dropout=0.0,
    model_type="modernbert", norm_bias=False, norm_eps=1e-05, num_attention_heads=4, num_hidden_layers=4,
    position_embedding_type="absolute", reference_compile=True, sparse_pred_ignore_index=-100,
    sparse_prediction=False, torch_dtype="float32", transformers_version="4.47.0.dev0", vocab_size=208)

GEMMA2 = dict(  # google/gemma-2-2b: local and global layers in turn, both soft-caps, stored in float32
    architectures=["Gemma2ForCausalLM"], attention_bias=False, attention_dropout=0.0, attn_logit_softcapping=50.0,
    bos_token_id=2, cache_implementation="hybrid", eos_token_id=1, final_logit_softcapping=30.0, head_dim=16,
    hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", hidden_size=48, initializer_range=0.02,
    intermediate_size=64, max_position_embeddings=8192, model_type="gemma2", num_attention_heads=6,
    num_hidden_layers=4, num_key_value_heads=2, pad_token_id=0, query_pre_attn_scalar=16,  # real 256 (= head_dim)
    rms_norm_eps=1e-06, rope_theta=10000.0, sliding_window=5,  # real 4096
    torch_dtype="float32", transformers_version="4.42.4", use_cache=True, vocab_size=VOCAB)

GEMMA3_1B = dict(  # google/gemma-3-1b-it: 5 local layers (window 512, shrunk to 5) to 1 global, two RoPE bases
    architectures=["Gemma3ForCausalLM"], attention_bias=False, attention_dropout=0.0, attn_logit_softcapping=None,
    bos_token_id=2, cache_implementation="hybrid", eos_token_id=[1, 106 % VOCAB], final_logit_softcapping=None,
    head_dim=16, hidden_activation="gelu_pytorch_tanh", hidden_size=48, initializer_range=0.02, intermediate_size=64,
    max_position_embeddings=32768, model_type="gemma3_text", num_attention_heads=4, num_hidden_layers=7,
    num_key_value_heads=1, pad_token_id=0, query_pre_attn_scalar=16,  # real 256 (= head_dim)
    rms_norm_eps=1e-06, rope_local_base_freq=10000, rope_scaling=None, rope_theta=1000000, sliding_window=5,
    sliding_window_pattern=6, torch_dtype="bfloat16", transformers_version="4.50.0.dev0", use_cache=True,
    vocab_size=VOCAB)

GEMMA3_4B = dict(  # google/gemma-3-4b-it: an image-text checkpoint whose text_config lists only what differs from
    # Gemma3TextConfig's defaults (heads 8, kv heads 4, head_dim 256, vocabulary 262208 are left out, as in the real
    # file), with linear RoPE scaling 8 on the global layers; sizes shrunk are the ones it writes
    architectures=["Gemma3ForConditionalGeneration"], boi_token_index=255999, eoi_token_index=256000,
    eos_token_id=[1, 106], image_token_index=262144, initializer_range=0.02,
    mm_tokens_per_image=4,  # real 256 (16 x 16 pooled from 64 x 64 patches; here 2 x 2 from 4 x 4)
    model_type="gemma3",
    text_config={"hidden_size": 48, "intermediate_size": 64, "model_type": "gemma3_text", "num_hidden_layers": 7,
                 "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                 "sliding_window": 5},  # real 2560, 10240, 34 layers, window 1024
    torch_dtype="bfloat16", transformers_version="4.50.0.dev0",
    vision_config={"hidden_size": 32, "image_size": 56, "intermediate_size": 48, "model_type": "siglip_vision_model",
                   "num_attention_heads": 2, "num_hidden_layers": 1, "patch_size": 14,
                   "vision_use_head": False})  # real 1152, 896, 4304, 16 heads, 27 layers

ROWS = {
    "llama-3.1": Row("meta-llama/Llama-3.1-8B-Instruct", LLAMA31),
    "llama-3.2": Row("meta-llama/Llama-3.2-1B", LLAMA32),
    "qwen2.5-yarn": Row("Qwen/Qwen2.5-7B-Instruct (+ YaRN)", QWEN25_YARN),
    "phi-3.5-mini": Row("microsoft/Phi-3.5-mini-instruct", PHI35),
    "phi-4-mini": Row("microsoft/Phi-4-mini-instruct", PHI4_MINI),
    "mistral-v0.1": Row("mistralai/Mistral-7B-v0.1", MISTRAL_V01, ["local, window 6"] * 3),
    "mistral-v0.3": Row("mistralai/Mistral-7B-Instruct-v0.3", MISTRAL_V03),
    "qwen3": Row("Qwen/Qwen3-8B", QWEN3),
    "smollm3": Row("HuggingFaceTB/SmolLM3-3B", SMOLLM3, _n(["global"] * 3 + ["global, no positions"], 8)),
    "granite-3": Row("ibm-granite/granite-3.1-8b-instruct", GRANITE),
    "olmo-2": Row("allenai/OLMo-2-1124-7B", OLMO2, weights="float32"),
    "olmo-3": Row("allenai/Olmo-3-1025-7B", OLMO3, ["local, window 5"] * 3 + ["global"]),
    "modernbert": Row("answerdotai/ModernBERT-base", MODERNBERT, ["global", "local, window ±3", "local, window ±3",
                                                                  "global"], weights="float32"),
    "gemma-2": Row("google/gemma-2-2b", GEMMA2, ["local, window 5", "global"] * 2, weights="float32"),
    "gemma-3-1b": Row("google/gemma-3-1b-it", GEMMA3_1B, _n(["local, window 5"] * 5 + ["global"], 7)),
    "gemma-3-4b": Row("google/gemma-3-4b-it", GEMMA3_4B,  # a vision-language model (its text-only run here)
                      _n(["local, window 5, image tokens both ways"] * 5 + ["global, image tokens both ways"], 7),
                      rename=(("model.language_model.", "language_model.model."),
                              ("model.vision_tower.", "vision_tower."),
                              ("model.multi_modal_projector.", "multi_modal_projector."),
                              ("lm_head.", "language_model.lm_head."))),
}


def _tokenizer(row: Row):
    if row.config["model_type"] == "modernbert":
        from tests.hub.test_parity_modernbert import modernbert_tokenizer
        return modernbert_tokenizer()
    return train_tokenizer()


def make_hub_folder(folder, name: str):
    """transformers' model built from the row's config.json, its weights moved off their init and stored in
    the real checkpoint's dtype under the real tensor names; then config.json is the row's own (legacy
    fields and all), not the one save_pretrained writes. Returns the folder."""
    row = ROWS[name]
    cfg = row.config
    torch.manual_seed(sorted(ROWS).index(name))
    hf_cfg = transformers.CONFIG_MAPPING[cfg["model_type"]].from_dict(dict(cfg))
    hf = getattr(transformers, cfg["architectures"][0])(hf_cfg).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if "norm" in pname and pname.endswith("weight"):  # Gemma's (1 + w) norms want w near 0
                p.copy_(torch.randn_like(p) * 0.3 + (0.0 if cfg["model_type"].startswith("gemma") else 1.0))
            else:
                p.copy_(torch.randn_like(p) * 0.15)
    hf.to(getattr(torch, row.weights)).save_pretrained(folder, safe_serialization=True)
    if row.rename:  # the tensor names of the (older) real checkpoint, which transformers 5 reads too
        from safetensors.torch import load_file, save_file

        path = folder / "model.safetensors"
        tensors = load_file(str(path))
        for new, old in row.rename:
            tensors = {old + k[len(new):] if k.startswith(new) else k: t for k, t in tensors.items()}
        save_file(tensors, str(path), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    _tokenizer(row).save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory):
    return per_name(tmp_path_factory, make_hub_folder)


def reference(folder, cfg: dict):
    """transformers' own reading of the folder (its config.json as written), eager and in float32."""
    cls = getattr(transformers, cfg["architectures"][0])
    return cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def test_the_rows_look_like_hub_files():
    for name, row in ROWS.items():
        cfg = row.config
        assert "quantization_config" not in cfg, name
        assert isinstance(cfg["architectures"], list), name
        assert cfg["architectures"][0].endswith(("ForCausalLM", "ForMaskedLM", "ForConditionalGeneration")), name
        assert cfg["torch_dtype"] in ("bfloat16", "float32") and cfg["transformers_version"].startswith("4."), name


@pytest.mark.parametrize("name", list(ROWS))
def test_a_real_config_json_loads_and_matches_transformers(hub_folder, name):
    row = ROWS[name]
    folder = hub_folder(name)
    m = ax.load_model(str(folder), device="cpu")
    family = row.family or row.config["model_type"]
    assert m.info.family == family, f"{name}: family {m.info.family!r}"
    assert list(m.info.layer_kinds) == row.kinds, f"{name}: layer_kinds {list(m.info.layer_kinds)}"
    assert m.info.num_layers == row.config.get("text_config", row.config)["num_hidden_layers"], name
    assert {p.dtype for p in m.module.parameters()} == {torch.float32}, name  # torch_dtype does not pick ours
    hf = reference(folder, row.config)
    vocab = min(row.config.get("vocab_size", VOCAB), _tokenizer(row).get_vocab_size())
    ids = torch.randint(5, vocab, (2, N), generator=torch.Generator().manual_seed(7))
    maps, hidden, ours = max_differences(hf, m, ids)
    # the hidden state's bound is 1e-5 of its largest entry where that exceeds 1: Gemma 3 4b's real default widths
    # (8 heads of 256) give entries near 4, and float32 rounding (oneDNN's and transformers' product orders differ)
    # grows with them; every other row is 0 / 0 here
    if row.family:  # an image-text checkpoint loaded as its language model: the user is told what is missing
        assert "not loaded" in m.info.note, f"{name}: note {m.info.note!r}"
    scale = max(1.0, ours.hidden.abs().max().item())
    print(f"{name} ({row.real}): maps {maps:.2g} hidden {hidden:.2g} (largest entry {scale:.2g})")
    assert maps <= TOL and hidden <= TOL * scale, \
        f"{name} ({row.real}): maps {maps:.3g}, hidden {hidden:.3g} off transformers"


def _listed(message: str) -> dict[str, list[str]]:
    """The refusal's groups: {"text decoders": [model_type, ...], ...}."""
    listing = message.split("supported model types: ", 1)[1]
    return {label: names.split(", ") for label, names in (g.split(": ", 1) for g in listing.split("; "))}


def test_an_unknown_model_type_names_every_row_in_one_readable_line(tmp_path):
    from attn_explorer.errors import UserError
    from attn_explorer.hub.families import ARCHITECTURES

    make_hub_folder(tmp_path, "olmo-2")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": "t5"}))
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    message = str(e.value)
    assert "\n" not in message and "unsupported architecture 't5'" in message
    groups = _listed(message)
    assert list(groups) == ["text decoders", "text encoders", "encoder-decoders", "vision and image-text"]
    named = [mt for names in groups.values() for mt in names]
    assert sorted(named) == sorted(ARCHITECTURES), set(named) ^ set(ARCHITECTURES)  # each row once, nothing else
    assert all(names == sorted(names) for names in groups.values())
    assert "modernbert" in groups["text encoders"] and "clip_text_model" in groups["vision and image-text"]
    assert "smollm3" in groups["text decoders"] and "bart" in groups["encoder-decoders"]
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "model_type"}))
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(e.value) and sorted(mt for v in _listed(str(e.value)).values() for mt in v) == sorted(
        ARCHITECTURES)


@pytest.mark.parametrize("name", ["llama-3.1", "olmo-3"])
def test_the_same_checkpoint_rewritten_by_transformers_5_reads_the_same(hub_folder, tmp_path, name):
    """config.json as transformers 5 writes it (`dtype` for `torch_dtype`, rope_parameters holding rope_theta,
    per layer type for OLMo 3) next to the same tensors: our maps are the legacy file's, and transformers'."""
    import shutil

    folder = hub_folder(name)
    row = ROWS[name]
    hf_cfg = transformers.CONFIG_MAPPING[row.config["model_type"]].from_dict(dict(row.config))
    new = {k: v for k, v in row.config.items() if k not in ("torch_dtype", "rope_scaling", "rope_theta")}
    new.update(dtype=row.config["torch_dtype"], rope_parameters=hf_cfg.rope_parameters, transformers_version="5.0.0")
    shutil.copytree(folder, tmp_path / "v5")
    (tmp_path / "v5" / "config.json").write_text(json.dumps(new, indent=2))
    ids = torch.randint(5, VOCAB, (1, N), generator=torch.Generator().manual_seed(5))
    legacy, v5 = (ax.load_model(str(f), device="cpu") for f in (folder, tmp_path / "v5"))
    with torch.inference_mode():
        a, b = legacy.module(input_ids=ids, output_attentions=True), v5.module(input_ids=ids, output_attentions=True)
    assert torch.equal(a.attentions, b.attentions) and torch.equal(a.hidden, b.hidden), name
    maps, hidden = max_differences(reference(tmp_path / "v5", new), v5, ids)[:2]
    assert maps <= TOL and hidden <= TOL, (name, maps, hidden)
