"""Decoder folders saved without a language-model head (transformers' LlamaModel, GPT2Model) load like
BERT's base folders: the same attentions and hidden states as transformers. Where the config ties the
head to the embedding, that is the head and they generate; an untied one had its head left out, so it
shows attention but refuses to generate, in one line. An untied GPT-2 head is read, not replaced."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.tiny_llama import train_tokenizer  # noqa: E402

TOL = 1e-5


def _saved_keys(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


def _llama_config(vocab: int, tie: bool):
    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, tie_word_embeddings=tie,
        initializer_range=0.2, attn_implementation="eager", bos_token_id=1, eos_token_id=2, pad_token_id=0)


def bare_llama(folder, tie: bool):
    """transformers.LlamaModel (no LM head) saved with save_pretrained, with a tokenizer."""
    tok = train_tokenizer()
    torch.manual_seed(0)
    hf = transformers.LlamaModel(_llama_config(tok.get_vocab_size(), tie)).eval()
    hf.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    assert not any("lm_head" in k for k in _saved_keys(folder))
    return hf


def _parity(hf, m, vocab: int):
    ids = torch.randint(3, vocab, (2, 19))
    with torch.no_grad():
        ref = hf(input_ids=ids, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
    assert ours.attentions.shape[1] == len(ref.attentions)
    for i, a in enumerate(ref.attentions):
        torch.testing.assert_close(ours.attentions[:, i], a, atol=TOL, rtol=0, msg=f"layer {i} attention")
    torch.testing.assert_close(ours.hidden, ref.last_hidden_state, atol=TOL, rtol=0)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_a_bare_llama_model_folder_loads_with_transformers_numbers(tmp_path, tie):
    hf = bare_llama(tmp_path, tie)
    m = ax.load_model(tmp_path, device="cpu")
    assert m.info.family == "llama" and m.info.causal and m.info.trained
    _parity(hf, m, hf.config.vocab_size)
    r = m.run("The capital of France is Paris.")
    assert r.attentions.shape[:2] == (2, 6) and r.attentions.shape[-1] == len(r.tokens)


def test_an_untied_bare_llama_refuses_to_generate_in_one_line(tmp_path):
    bare_llama(tmp_path, tie=False)
    m = ax.load_model(tmp_path, device="cpu")
    assert not m.info.can_generate and "no language-model head" in m.info.note
    with pytest.raises(UserError) as e:
        m.generate("The capital of France", 3)
    message = str(e.value)
    assert "\n" not in message and "no language-model head" in message and "lm_head.weight" in message


def test_a_tied_bare_llama_generates_as_transformers_causal_lm(tmp_path):
    """Tied: the head is the embedding, so LlamaForCausalLM on the same folder is the same model."""
    bare_llama(tmp_path, tie=True)
    m = ax.load_model(tmp_path, device="cpu")
    assert m.info.can_generate
    g = m.generate("The capital of France", max_new_tokens=5)
    steps = list(g)
    lm = transformers.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        out = lm.generate(torch.tensor([g.prompt_ids]), max_new_tokens=len(steps), do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert out[0, len(g.prompt_ids):].tolist() == [s.token_id for s in steps]


def _gpt2_config(tie: bool):
    return transformers.GPT2Config(vocab_size=80, n_embd=32, n_layer=2, n_head=4, n_positions=40,
                                   attn_implementation="eager", initializer_range=0.3, tie_word_embeddings=tie)


def test_an_untied_bare_gpt2_loads_and_refuses_to_generate(tmp_path):
    torch.manual_seed(0)
    hf = transformers.GPT2Model(_gpt2_config(tie=False)).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    m = ax.load_model(tmp_path, device="cpu")
    _parity(hf, m, 80)
    assert not m.info.can_generate
    with pytest.raises(UserError, match="no language-model head"):
        m.generate("hello", 2)


def test_an_untied_gpt2_head_is_read_not_replaced_by_the_embedding(tmp_path):
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(_gpt2_config(tie=False)).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    assert "lm_head.weight" in _saved_keys(tmp_path)
    m = ax.load_model(tmp_path, device="cpu")
    assert m.info.can_generate
    ids = torch.randint(0, 80, (1, 11))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    with torch.inference_mode():
        logits = m.module.logits(m.module(input_ids=ids).hidden)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def test_a_tied_gpt2_lm_head_model_still_uses_the_embedding(tmp_path):
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(_gpt2_config(tie=True)).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    m = ax.load_model(tmp_path, device="cpu")
    ids = torch.randint(0, 80, (1, 9))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    with torch.inference_mode():
        logits = m.module.logits(m.module(input_ids=ids).hidden)
    assert m.info.can_generate
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
