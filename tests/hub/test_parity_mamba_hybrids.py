"""Granite 4 hybrid (granitemoehybrid) and Falcon-H1 (falcon_h1) against transformers 5.24's torch path (no CUDA
kernels): tiny random configs built here, every weight moved off its init (A_log, D, dt_bias and the norms too),
saved with save_pretrained and loaded through ax.load_model. The last hidden state within 1e-5, logits close,
the softmax layers' maps within 1e-5, 20 greedy tokens through our recurrent state cache equal transformers'."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from tests.hub.test_parity_rotary_families import (N, TOL, VOCAB,  # noqa: E402
                                                   built_fixture, greedy_steps, make_folder)

MAMBA = dict(mamba_n_heads=4, mamba_d_head=24, mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=8)
GRANITE = ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM")
FALCON = ("FalconH1Config", "FalconH1ForCausalLM")
CASES = {
    # mamba, attention, mamba; RoPE on the attention layer; MoE (4 experts, top 2) and the shared MLP; multipliers
    "granite4": (*GRANITE, dict(MAMBA, layer_types=["mamba", "attention", "mamba"], position_embedding_type="rope",
                                num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                shared_intermediate_size=40, mamba_n_groups=2, embedding_multiplier=1.5,
                                attention_multiplier=0.2, residual_multiplier=0.7, logits_scaling=2.5)),
    # no positions at all, no experts (the shared MLP alone), one group, transformers 5's layer names
    "granite4-nope-dense": (*GRANITE, dict(MAMBA, layer_types=["linear_attention", "linear_attention",
                                                               "full_attention"], num_key_value_heads=3,
                                           num_local_experts=0, shared_intermediate_size=40)),
    # Mamba-2 beside attention in every layer, the gated norm (norm before gate), every multiplier off 1
    "falcon_h1": (*FALCON, dict(MAMBA, mamba_d_ssm=96, mamba_n_groups=2, num_key_value_heads=2, mamba_rms_norm=True,
                                key_multiplier=0.6, attention_in_multiplier=1.3, attention_out_multiplier=0.8,
                                ssm_in_multiplier=1.2, ssm_out_multiplier=0.9, ssm_multipliers=[0.8, 1.1, 0.9, 1.2, 0.7],
                                mlp_multipliers=[1.3, 0.6], embedding_multiplier=1.4, lm_head_multiplier=0.7)),
    # no gated norm (y · silu(z)), untied, the default multipliers
    "falcon_h1-plain": (*FALCON, dict(MAMBA, mamba_d_ssm=48, mamba_d_head=12, num_key_value_heads=3,
                                      mamba_rms_norm=False)),
}


def make(folder, name):
    hf = make_folder(folder, name, cases=CASES)
    return hf


built = built_fixture(make)


def _ids(seed=7, n=N):
    return torch.randint(3, VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


def _softmax_layers(m):
    return [i for i, k in enumerate(m.module.cfg.layer_kinds()) if "Mamba-2 (implicit)" != k]


@pytest.mark.parametrize("name", list(CASES))
def test_hybrid_parity_with_transformers(built, name):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    ids = _ids()
    with torch.no_grad():
        ref = hf.model(input_ids=ids, output_attentions=True)
        ref_logits = hf(input_ids=ids).logits
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
        logits = m.module.logits(ours.hidden)
    hidden = (ours.hidden - ref.last_hidden_state).abs().max().item()
    layers = _softmax_layers(m)
    assert len(layers) == len(ref.attentions)
    maps = max((ours.attentions[:, i, :a.shape[1]] - a).abs().max().item() for i, a in zip(layers, ref.attentions))
    print(f"{name}: maps {maps:.1e} hidden {hidden:.1e}")
    assert maps <= TOL and hidden <= TOL, (name, maps, hidden)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_equals_transformers(built, name):
    hf, folder = built(name)
    greedy_steps(hf, ax.load_model(str(folder), device="cpu"), max_new_tokens=20)


@pytest.mark.parametrize("name", list(CASES))
def test_twenty_greedy_tokens_through_the_recurrent_cache(built, name):
    """Our module step by step (prefill, then one token at a time through new_cache()'s conv and SSM states):
    20 greedy tokens, none stopped by a special token, equal to transformers' generate."""
    hf, folder = built(name)
    module = ax.load_model(str(folder), device="cpu").module
    prompt = _ids(5, 9)[:1]
    with torch.no_grad():
        want = hf.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    got, cache, feed = [], module.new_cache(), prompt
    with torch.inference_mode():
        for _ in range(20):
            nxt = int(module.logits(module(input_ids=feed, cache=cache).hidden[:, -1]).argmax(-1))
            got.append(nxt)
            feed = torch.tensor([[nxt]])
    assert cache.length == 9 + 19
    assert got == want[0, 9:].tolist()


@pytest.mark.parametrize("name", ["granite4", "falcon_h1"])
def test_right_padding(built, name):
    """A right-padded second row (transformers zeroes padding tokens' Mamba-2 inputs, as we do): its real
    tokens' hidden states and the softmax layers' real rows equal transformers', the unpadded row's all."""
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    ids = _ids(11)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    with torch.no_grad():
        ref = hf.model(input_ids=ids, attention_mask=mask, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, attention_mask=mask, output_attentions=True)
    torch.testing.assert_close(ours.hidden[0], ref.last_hidden_state[0], atol=TOL, rtol=0)
    torch.testing.assert_close(ours.hidden[1, :15], ref.last_hidden_state[1, :15], atol=TOL, rtol=0)
    for i, a in zip(_softmax_layers(m), ref.attentions):
        H = a.shape[1]
        torch.testing.assert_close(ours.attentions[1, i, :H, :15, :15], a[1, :, :15, :15], atol=TOL, rtol=0)
