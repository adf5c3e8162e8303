"""The Llama family against transformers eager, on tiny random configs saved as HF folders and loaded
through our architecture table; and the KV cache against a full recompute (Llama and GPT-2)."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.core.gpt2 import GPT2, GPT2Config  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TOL = 1e-5

CONFIGS = {  # grouped-query attention, RoPE bases, tied and untied LM heads
    "gqa6-2-tied": dict(num_attention_heads=6, num_key_value_heads=2, hidden_size=48, rope_theta=10000.0),
    "gqa9-3-untied": dict(num_attention_heads=9, num_key_value_heads=3, hidden_size=72, rope_theta=100000.0,
                          tie_word_embeddings=False),
    "mha4-theta500": dict(num_attention_heads=4, num_key_value_heads=4, hidden_size=32, rope_theta=500.0),
    "bias-untied": dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=48, attention_bias=True,
                        mlp_bias=True, tie_word_embeddings=False),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: make_llama_folder(tmp_path_factory.mktemp(name), seed=i, **kw)
            for i, (name, kw) in enumerate(CONFIGS.items())}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_llama_parity_with_transformers(folders, name):
    folder = folders[name]
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    m = ax.load_model(folder, device="cpu")
    cfg = hf.config
    assert m.info.family == "llama" and m.info.causal
    assert m.info.num_heads == cfg.num_attention_heads and m.module.cfg.num_kv_heads == cfg.num_key_value_heads
    assert (m.module.lm_head is None) == cfg.tie_word_embeddings
    ids = torch.randint(3, cfg.vocab_size, (2, 37))  # RoPE at positions 0..36
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
        logits = m.module.logits(ours.hidden)
    for i, a in enumerate(ref.attentions):
        torch.testing.assert_close(ours.attentions[:, i], a, atol=TOL, rtol=0, msg=f"layer {i} attention")
    torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=1e-4)


def test_untied_head_is_its_own_matrix(folders):
    """An untied checkpoint's lm_head is read, not replaced by the embedding: logits differ from wte·h."""
    m = ax.load_model(folders["gqa9-3-untied"], device="cpu")
    h = torch.randn(3, m.info.hidden_size)
    with torch.no_grad():
        assert not torch.allclose(m.module.logits(h), h @ m.module.embed_tokens.weight.T, atol=1e-3)


def _cached_vs_full(module, ids: torch.Tensor, split: int):
    """Logits and attention of the tokens after `split`: fed one at a time through a cache, and in one
    full forward."""
    with torch.inference_mode():
        full = module(input_ids=ids, output_attentions=True)
        full_logits = module.logits(full.hidden)
        cache = module.new_cache()
        out = module(input_ids=ids[:, :split], output_attentions=True, cache=cache)
        torch.testing.assert_close(module.logits(out.hidden), full_logits[:, :split], atol=TOL, rtol=0)
        for p in range(split, ids.shape[1]):
            out = module(input_ids=ids[:, p:p + 1], output_attentions=True, cache=cache)
            assert cache.length == p + 1
            assert out.attentions.shape[-2:] == (1, p + 1)
            torch.testing.assert_close(module.logits(out.hidden[:, 0]), full_logits[:, p], atol=TOL, rtol=0)
            torch.testing.assert_close(out.attentions[:, :, :, 0], full.attentions[:, :, :, p, : p + 1],
                                       atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["gqa6-2-tied", "gqa9-3-untied"])
def test_kv_cache_equals_full_recompute_llama(folders, name):
    m = ax.load_model(folders[name], device="cpu")
    torch.manual_seed(1)
    _cached_vs_full(m.module, torch.randint(3, 200, (1, 20)), split=7)


def test_kv_cache_equals_full_recompute_gpt2():
    torch.manual_seed(2)
    module = GPT2(GPT2Config(vocab_size=90, dim=32, num_layers=2, num_heads=4, mlp_hidden=64, max_positions=40)).eval()
    _cached_vs_full(module, torch.randint(0, 90, (1, 15)), split=5)


def test_past_the_last_position_is_refused(folders):
    m = ax.load_model(folders["gqa6-2-tied"], device="cpu")
    cache = m.module.new_cache()
    with torch.inference_mode(), pytest.raises(ValueError, match="positions"):
        m.module(input_ids=torch.ones(1, 129, dtype=torch.long), cache=cache)
