"""Qwen3.5 (qwen3_5_text, the multimodal qwen3_5's language model) and Qwen3-Next (qwen3_next, MoE with a gated
shared expert) against transformers' torch path (eager attention, the torch chunked delta rule: no CUDA kernels on
the CPU): hidden states and the softmax layers' maps within 1e-5, logits close, greedy generation through the
recurrent cache equal; the recurrent layers' maps are NaN past their own heads; the interface (ModelInfo.mixers,
layer_heads, layer_kinds), the hooks, ablation of a recurrent head, refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_5")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub import test_parity_rotary_families as rotary  # noqa: E402
from tests.hub.test_parity_rotary_families import N, TOL, VOCAB  # noqa: E402

COMMON = dict(rotary.COMMON, num_hidden_layers=4, head_dim=16, num_key_value_heads=2, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4,
              max_position_embeddings=256)
CASES = {
    # 4 value heads beside 6 softmax heads (NaN padding), RoPE on half of d_k
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(partial_rotary_factor=0.5)),
    # as many recurrent heads as softmax heads, tied, one key head per 3 value heads, kernel 3, two softmax layers
    "qwen3_5-equal": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                      dict(linear_num_value_heads=6, linear_num_key_heads=2, linear_conv_kernel_dim=3,
                           tie_word_embeddings=True,
                           layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])),
    # MoE on layers 0, 2, 3 with a gated shared expert; the fused qkvz / ba projections
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=24, mlp_only_layers=[1])),
}


def make_folder(folder, name: str):
    return rotary.make_folder(folder, name, CASES, COMMON, seed=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return rotary.folders(tmp_path_factory, make_folder)


def differences(hf, m, ids):
    """(max |ours - transformers| over the softmax layers' maps, over the last hidden state), ours."""
    with torch.no_grad():
        ref = hf.model(input_ids=ids, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
    soft = [i for i, k in enumerate(m.info.mixers) if k == "softmax"]
    assert len(ref.attentions) == len(soft)
    att = max((ours.attentions[:, i] - a).abs().max().item() for i, a in zip(soft, ref.attentions))
    return att, (ours.hidden - ref.last_hidden_state).abs().max().item(), ours


@pytest.mark.parametrize("n", [N, 150])  # 150 tokens: three chunks of the chunked form
@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(built, name, n):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    ids = torch.randint(3, VOCAB, (2, n), generator=torch.Generator().manual_seed(7))
    att, hidden, ours = differences(hf, m, ids)
    print(f"{name} ({n} tokens): maps {att:.2e} hidden {hidden:.2e}")
    assert att <= TOL and hidden <= TOL, (name, att, hidden)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    with torch.inference_mode():
        logits = m.module.logits(ours.hidden)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4, msg=name)


def test_the_interface_says_each_layers_kind_and_heads(built):
    _, folder = built("qwen3_5")
    m = ax.load_model(str(folder), device="cpu")
    i = m.info
    assert i.family == "qwen3_5_text" and i.mixers == ("deltanet",) * 3 + ("softmax",)
    assert i.layer_heads == (4, 4, 4, 6) and i.num_heads == 6
    assert i.layer_kinds == ("gated DeltaNet (implicit)",) * 3 + ("softmax, global",)
    r = m.run("the cat sat on the mat")
    assert r.attentions.shape[:2] == (4, 6)
    assert (r.attentions[:3, 4:] == 0).all() and (np.abs(r.attentions[:3, :4]).sum(-1) > 0).all()  # zero padding
    lower = np.tril(np.ones(r.attentions.shape[-2:], dtype=bool))
    assert (r.attentions[0, :4][:, ~lower] == 0).all()  # causal
    with pytest.raises(UserError, match="H4"):  # a padded head does not exist
        m.run("the cat sat on the mat", ablate={(0, 4): "zero"})
    m.run("the cat sat on the mat", ablate={(3, 4): "zero"})  # the softmax layer has it
    _, folder = built("qwen3_5-equal")
    e = ax.load_model(str(folder), device="cpu").info
    assert e.layer_heads == (6,) * 4 and e.mixers == ("deltanet", "softmax") * 2


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_equals_transformers(built, name):
    """20 tokens through our cache (RecurrentState on the DeltaNet layers, keys and values on the others)."""
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    g = m.generate("The capital of France is Paris. The capital of Italy", max_new_tokens=20)
    steps = list(g)  # up to a special token
    with torch.no_grad():
        out = hf.generate(torch.tensor([g.prompt_ids]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    assert [s.token_id for s in steps] == out[0, len(g.prompt_ids):len(g.prompt_ids) + len(steps)].tolist()
    # all 20, one token a step through the module's cache (no stop at special tokens)
    ids, cache, mine = torch.tensor([g.prompt_ids]), m.module.new_cache(), []
    with torch.inference_mode():
        for _ in range(20):
            nxt = int(m.module.logits(m.module(input_ids=ids, cache=cache).hidden)[0, -1].argmax())
            mine.append(nxt)
            ids = torch.tensor([[nxt]])
    assert mine == out[0, len(g.prompt_ids):].tolist()


def _edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    for k, v in list(cfg.items()):
        if v is None:
            del cfg[k]
    path.write_text(json.dumps(cfg))
    return cfg


def test_legacy_rope_fields_read_as_rope_parameters(built, tmp_path):
    """config.json with rope_theta and partial_rotary_factor at the top (no rope_parameters) loads the same."""
    hf, folder = built("qwen3_5")
    m = ax.load_model(str(folder), device="cpu")
    import shutil
    shutil.copytree(folder, tmp_path / "legacy")
    p = _edit_config(tmp_path / "legacy", rope_parameters=None, rope_theta=10000.0, partial_rotary_factor=0.5)
    assert "rope_parameters" not in p
    legacy = ax.load_model(str(tmp_path / "legacy"), device="cpu")
    assert legacy.module.cfg.rotary_dim == m.module.cfg.rotary_dim == 8
    r1, r2 = m.run("the cat sat"), legacy.run("the cat sat")
    np.testing.assert_array_equal(r1.hidden, r2.hidden)


@pytest.mark.parametrize("changes, words", [
    (dict(layer_types=["linear_attention", "sliding_attention", "linear_attention", "full_attention"]),
     "layer type 'sliding_attention'"),
    (dict(linear_num_value_heads=5), "linear_num_value_heads"),
    (dict(hidden_act="gelu"), "hidden_act"),
])
def test_what_we_do_not_implement_is_refused_in_one_line(tmp_path, changes, words):
    make_folder(tmp_path, "qwen3_5")
    _edit_config(tmp_path, **changes)
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    assert words in str(e.value) and "qwen3_5_text" in str(e.value) and "\n" not in str(e.value)


def test_the_multimodal_folder_loads_its_language_model(built, tmp_path):
    """Part D: a config.json as Qwen/Qwen3.5 checkpoints ship it (model_type qwen3_5, Qwen3_5ForConditionalGeneration,
    text_config, vision_config, dtype), with the language model under model.language_model.* and a vision tensor
    that is not loaded."""
    from safetensors.torch import load_file, save_file

    hf, folder = built("qwen3_5")
    text = json.loads((folder / "config.json").read_text())
    (tmp_path / "tokenizer.json").write_text((folder / "tokenizer.json").read_text())
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "dtype": "bfloat16",
           "image_token_id": 248056, "video_token_id": 248057, "tie_word_embeddings": False,
           "text_config": {k: v for k, v in text.items() if k not in ("architectures", "dtype", "transformers_version")}
           | {"model_type": "qwen3_5_text", "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                   "partial_rotary_factor": 0.5, "mrope_interleaved": True,
                                                                   "mrope_section": [2, 1, 1]}},
           "vision_config": {"model_type": "qwen3_5", "depth": 1, "hidden_size": 16, "out_hidden_size": 48}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(folder / "model.safetensors"))
    sd = {("lm_head.weight" if k == "lm_head.weight" else "model.language_model." + k[len("model."):]): v
          for k, v in sd.items()}
    sd["model.visual.patch_embed.proj.weight"] = torch.zeros(16, 3, 2, 2, 2)
    save_file(sd, str(tmp_path / "model.safetensors"))
    m = ax.load_model(str(tmp_path), device="cpu", dtype="float32")
    assert m.info.family == "qwen3_5_text" and "vision tower is not loaded" in m.info.note
    ref = ax.load_model(str(folder), device="cpu")
    np.testing.assert_array_equal(m.run("the cat sat").hidden, ref.run("the cat sat").hidden)


def test_a_hub_shaped_qwen3_next_folder_loads_and_matches_transformers(built, tmp_path):
    """Part D: config.json with the keys Qwen/Qwen3-Next-80B-A3B-Instruct ships (torch_dtype, rope_theta and
    partial_rotary_factor at the top, no layer_types but full_attention_interval, no rope_parameters), shrunk, and
    its multi-token-prediction tensors (mtp.*, which transformers leaves unread)."""
    from safetensors.torch import load_file, save_file

    _, folder = built("qwen3_next")
    cfg = {"architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 1, "decoder_sparse_step": 1, "eos_token_id": 2, "full_attention_interval": 4,
           "head_dim": 16, "hidden_act": "silu", "hidden_size": 48, "initializer_range": 0.02,
           "intermediate_size": 64, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8, "linear_num_key_heads": 2,
           "linear_num_value_heads": 4, "linear_value_head_dim": 12, "max_position_embeddings": 256,
           "mlp_only_layers": [1], "model_type": "qwen3_next", "moe_intermediate_size": 32, "norm_topk_prob": True,
           "num_attention_heads": 6, "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 4,
           "num_key_value_heads": 2, "output_router_logits": False, "partial_rotary_factor": 0.25,
           "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
           "shared_expert_intermediate_size": 24, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "transformers_version": "4.57.0.dev0", "use_cache": True, "use_sliding_window": False, "vocab_size": VOCAB}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "tokenizer.json").write_text((folder / "tokenizer.json").read_text())
    sd = load_file(str(folder / "model.safetensors"))
    sd["mtp.fc.weight"] = torch.zeros(48, 96)
    save_file(sd, str(tmp_path / "model.safetensors"))
    m = ax.load_model(str(tmp_path), device="cpu", dtype="float32")
    assert m.info.mixers == ("deltanet",) * 3 + ("softmax",) and m.module.cfg.rope_theta == 10000000
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    ids = torch.randint(3, VOCAB, (1, N), generator=torch.Generator().manual_seed(9))
    att, hidden, _ = differences(hf, m, ids)
    print(f"qwen3_next hub-shaped: maps {att:.2e} hidden {hidden:.2e}")
    assert att <= TOL and hidden <= TOL
