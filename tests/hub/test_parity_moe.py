"""Qwen3-MoE against transformers eager: tiny seeded random configs (every weight, the norms' and the routers'
too, moved off its init), saved with save_pretrained and loaded through our public loader; attention maps and
the last hidden state within 1e-5 in float32, logits and greedy tokens as transformers', in both RoPE config
forms; dense layers (mlp_only_layers, decoder_sparse_step) keep Qwen3's MLP. The routing a run records
(RunResult.routing) is transformers' router's own choice. Part C: hooks, lazy, prefix reuse, interventions,
relevance and the lens; part D: the config.json Qwen3-30B-A3B ships, shrunk."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.core.moe import MoE  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub import test_parity_rotary_families as rotary  # noqa: E402
from tests.hub.test_parity_rotary_families import COMMON, N, VOCAB  # noqa: E402
from tests.hub.test_rope_scaling import _save  # noqa: E402

MOE = {**COMMON, "num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 16,
       "num_experts": 6, "num_experts_per_tok": 2, "experts_implementation": "eager", "rope_theta": 1000.0}

# name -> (transformers config class, model class, config overrides)
CASES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(norm_topk_prob=True)),
    # layer 1 dense (mlp_only_layers: Qwen3's SwiGLU at intermediate_size); k = 3, not renormalised
    "qwen3_moe-dense": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                        dict(mlp_only_layers=[1], num_experts_per_tok=3, norm_topk_prob=False)),
    # every second layer MoE (decoder_sparse_step 2: layer 1 only), a window of 5 on every layer, tied, biases
    "qwen3_moe-step2": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                        dict(decoder_sparse_step=2, use_sliding_window=True, sliding_window=5,
                             tie_word_embeddings=True, attention_bias=True, norm_topk_prob=True)),
}
MOE_LAYERS = {"qwen3_moe": (True, True, True), "qwen3_moe-dense": (True, False, True),
              "qwen3_moe-step2": (False, True, False)}


def make_folder(folder, name: str):
    return rotary.make_folder(folder, name, CASES, MOE, seed=200)


built = rotary.built_fixture(make_folder)


def _check_parity(hf, m, name):
    rotary.check_parity(hf, m, name, torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(7)))


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(built, name):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.family == "qwen3_moe" and m.info.causal and m.info.can_generate
    assert m.info.moe_layers == MOE_LAYERS[name] and m.info.num_experts == 6
    kinds = [type(b.mlp).__name__ for b in m.module.blocks.layers]
    assert kinds == ["MoE" if moe else "SwiGLU" for moe in MOE_LAYERS[name]]
    _check_parity(hf, m, name)


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "rope_scaling"])
def test_both_rope_config_forms(built, tmp_path, legacy):
    """transformers 5's rope_parameters and the legacy rope_theta (+ rope_scaling: a YaRN one here) read alike."""
    torch.manual_seed(5)
    cfg = transformers.Qwen3MoeConfig(**{**MOE, "norm_topk_prob": True, "max_position_embeddings": 32,
                                         "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 500.0,
                                                             "original_max_position_embeddings": 16}})
    hf = transformers.Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    folder = _save(hf, tmp_path, legacy)
    written = json.loads((folder / "config.json").read_text())
    assert ("rope_scaling" in written) == legacy
    m = ax.load_model(str(folder), device="cpu")
    assert m.module.cfg.rope_scaling.kind == "yarn" and m.module.cfg.rope_theta == 500.0
    _check_parity(hf, m, f"qwen3_moe-yarn-{'legacy' if legacy else 'rope_parameters'}")


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_equals_transformers(built, name):
    hf, folder = built(name)
    _, steps = rotary.greedy_steps(hf, ax.load_model(str(folder), device="cpu"), max_new_tokens=20)
    assert len(steps) == 20


def _hf_routing(hf, ids):
    """transformers' own router's choice per MoE layer: (top-k indices, weights), from hooks on its gates."""
    got = {}

    def keep(layer):
        def hook(module, args, out):
            _, weights, indices = out
            got[layer] = (indices.detach().clone(), weights.detach().clone())
        return hook

    handles = [layer.mlp.gate.register_forward_hook(keep(i)) for i, layer in enumerate(hf.model.layers)
               if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts")]
    try:
        with torch.no_grad():
            hf.model(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
    return got


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_moe-dense"])
def test_run_records_transformers_routing(built, name):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    text = "The capital of France is Paris. The capital of Italy is Rome."
    r = m.run(text)
    rt = r.routing
    assert rt is not None and rt.num_experts == 6 and rt.num_layers == 3
    ids = torch.tensor([m.tokenizer.encode(text, 512).ids])
    ref = _hf_routing(hf, ids)
    assert rt.moe_layers == sorted(ref)
    for layer in range(3):
        if layer not in ref:
            assert rt.experts[layer] is None and rt.weights[layer] is None
            continue
        idx, w = ref[layer]
        assert rt.experts[layer].dtype == np.int64 and rt.weights[layer].dtype == np.float32
        assert np.array_equal(rt.experts[layer], idx.numpy())
        np.testing.assert_allclose(rt.weights[layer], w.numpy(), atol=1e-6)
    top_e, top_w = rt.top()
    assert top_e.shape == (3, len(r.tokens)) and ((top_e == -1) == ~np.asarray(MOE_LAYERS[name])[:, None]).all()
    for layer in rt.moe_layers:
        assert (top_w[layer] == rt.weights[layer].max(1)).all()


def test_a_dense_model_has_no_routing(tmp_path):
    from tests.tiny_llama import make_llama_folder
    m = ax.load_model(str(make_llama_folder(tmp_path)), device="cpu")
    assert m.run("a b c").routing is None and not m.info.moe_layers
    assert not any("expert" in n for n in m.hook_names())


def test_broken_fields_are_one_line(tmp_path):
    make_folder(tmp_path, "qwen3_moe")
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    for changes, field in (({"num_experts_per_tok": 7}, "num_experts_per_tok"),
                           ({"num_local_experts": -1}, "num_local_experts"),
                           ({"num_experts": 5}, "num_experts"),
                           ({"moe_intermediate_size": "big"}, "moe_intermediate_size"),
                           ({"decoder_sparse_step": 0}, "decoder_sparse_step"),
                           ({"mlp_only_layers": [5]}, "mlp_only_layers"),
                           ({"norm_topk_prob": "yes"}, "norm_topk_prob")):
        path.write_text(json.dumps({**cfg, **changes}))
        with pytest.raises(UserError) as e:
            ax.load_model(str(tmp_path), device="cpu")
        assert "\n" not in str(e.value) and "qwen3_moe" in str(e.value) and field in str(e.value), changes


def test_no_experts_is_a_dense_qwen3(tmp_path):
    """num_experts 0: transformers builds every layer dense; so do we, and say nothing of routing."""
    torch.manual_seed(3)
    cfg = transformers.Qwen3MoeConfig(**{**MOE, "num_experts": 0})
    hf = transformers.Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path)
    rotary.train_tokenizer().save(str(tmp_path / "tokenizer.json"))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert not any(isinstance(b.mlp, MoE) for b in m.module.blocks.layers) and m.run("a b").routing is None
    _check_parity(hf, m, "qwen3_moe-no-experts")


# Part D: the config.json Qwen/Qwen3-30B-A3B ships (its keys and value kinds, legacy rope_theta and
# rope_scaling null, torch_dtype, no quantization_config), shrunk only in its sizes; tensors stored in bfloat16
# under the hub's per-expert names. Token ids past the tiny vocabulary are shrunk into it (real ones in comments).
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1,  # real 151643
    "decoder_sparse_step": 1,
    "eos_token_id": 2,  # real 151645
    "head_dim": 16,  # real 128
    "hidden_act": "silu", "hidden_size": 48,  # real 2048
    "initializer_range": 0.02, "intermediate_size": 64,  # real 6144
    "max_position_embeddings": 40960, "max_window_layers": 3,  # real 48
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 16,  # real 768
    "norm_topk_prob": True, "num_attention_heads": 6,  # real 32
    "num_experts": 8, "num_experts_per_tok": 2,  # real 128, 8
    "num_hidden_layers": 3,  # real 48
    "num_key_value_heads": 2,  # real 4
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": VOCAB,
}


def test_the_hub_config_json_loads_and_matches_transformers(tmp_path):
    cfg = QWEN3_30B_A3B
    assert "quantization_config" not in cfg
    torch.manual_seed(11)
    hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig.from_dict(dict(cfg))).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm" in pname else 0.0))
    hf.to(torch.bfloat16).save_pretrained(tmp_path, safe_serialization=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    rotary.train_tokenizer().save(str(tmp_path / "tokenizer.json"))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.info.family == "qwen3_moe" and m.info.moe_layers == (True,) * 3 and m.info.num_experts == 8
    assert list(m.info.layer_kinds) == [] and {p.dtype for p in m.module.parameters()} == {torch.float32}
    ref = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager",
                                                           experts_implementation="eager").eval()
    _check_parity(ref, m, "qwen3_moe (Qwen/Qwen3-30B-A3B's config.json)")
    assert m.run("The capital of France").routing.experts[0].shape[1] == 2
