"""OPT, DistilBERT and ELECTRA in our modules (the GPT-2 decoder and the BERT encoder, chosen by config
fields) against transformers in eager mode, on tiny seeded random configs saved with save_pretrained:
attention maps and the last hidden state within 1e-5 in float32, and OPT's greedy generation with our
KV cache token for token as transformers' OPTForCausalLM."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity import _compare, _run_ours, linear_path  # noqa: E402,F401 - the shared fixture
from tests.tiny_llama import train_tokenizer  # noqa: E402

TOL = 1e-5
SPREAD = 0.3  # weights 15x HF's default spread: the MLP inputs reach |x| ~ 1-3, where a wrong activation shows


def _save(hf, folder, tokenizer):
    hf.save_pretrained(folder, safe_serialization=True)
    tokenizer(folder)
    return folder


# ---- tokenizers written into the folders, so `m.run(text)` works offline ----------------------------

PIECES = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran",
          "attention", "is", "all", "you", "need", ".", ",", "##s", "##ed", "##ing"]
VOCAB = len(PIECES)  # the encoders' vocab_size: every id has its word piece


def wordpiece_vocab(folder):
    """A vocab.txt for BERT-style word pieces (DistilBERT, ELECTRA): the loader reads it with `tokenizers`."""
    (folder / "vocab.txt").write_text("\n".join(PIECES) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}), encoding="utf-8")


def byte_level_bpe(folder):
    """OPT's kind of tokenizer: byte-level BPE, trained here (tests/tiny_llama.py), as tokenizer.json."""
    train_tokenizer().save(str(folder / "tokenizer.json"))


# ---- OPT ------------------------------------------------------------------------------------------

def _opt_config(vocab: int, **over):
    cfg = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=48,
               max_position_embeddings=40, word_embed_proj_dim=32, do_layer_norm_before=True,
               activation_function="relu", init_std=SPREAD, attn_implementation="eager",
               pad_token_id=1, bos_token_id=2, eos_token_id=2)
    cfg.update(over)
    return transformers.OPTConfig(**cfg)


OPT_CASES = {
    "pre_ln": {},  # OPT-125m and every size from 1.3b up
    "post_ln_projected": dict(do_layer_norm_before=False, word_embed_proj_dim=16),  # OPT-350m's layout
    "projected": dict(word_embed_proj_dim=24, num_attention_heads=2),
    "no_bias": dict(enable_bias=False),
}


@pytest.mark.parametrize("case", list(OPT_CASES))
def test_opt_parity(tmp_path, case, linear_path):
    torch.manual_seed(0)
    vocab = train_tokenizer().get_vocab_size()
    hf = transformers.OPTModel(_opt_config(vocab, **OPT_CASES[case])).eval()
    with torch.no_grad():  # make the learned positions count as much as the tokens
        hf.decoder.embed_positions.weight.normal_(std=SPREAD)
    m = ax.load_model(str(_save(hf, tmp_path / case, byte_level_bpe)), device="cpu")
    assert m.info.family == "opt" and m.info.causal and m.info.num_heads == hf.config.num_attention_heads
    assert m.info.max_positions == 40  # the table has 42 rows: positions 0..39 read rows 2..41
    ids = torch.randint(3, vocab, (2, 13))
    with torch.no_grad():
        ref = hf(input_ids=ids, output_attentions=True)
    ours = _run_ours(m, input_ids=ids)
    _compare(ref, ours, 2)
    upper = torch.triu(torch.ones(13, 13, dtype=torch.bool), diagonal=1)
    assert ours.attentions[..., upper].abs().max() == 0  # nothing looks ahead
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # right padding on the second sequence: its real rows must agree
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_attentions=True)
    ours = _run_ours(m, input_ids=ids, attention_mask=mask)
    for i, a in enumerate(ref.attentions):
        torch.testing.assert_close(ours.attentions[:, i][1, :, :9], a[1, :, :9], atol=TOL, rtol=0)
        torch.testing.assert_close(ours.attentions[:, i][0], a[0], atol=TOL, rtol=0)
    torch.testing.assert_close(ours.hidden[1, :9], ref.last_hidden_state[1, :9], atol=TOL, rtol=0)
    text = "The capital of France is Paris."
    r = m.run(text, hidden=True)  # the saved tokenizer, through the public API
    assert r.attentions.shape[:2] == (2, hf.config.num_attention_heads)
    assert r.hidden.shape[-1] == hf.config.word_embed_proj_dim  # projected back out where OPT has project_out
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([m.tokenizer.encode(text, 40).ids]), output_attentions=True)
    assert abs(r.hidden - ref.last_hidden_state[0].numpy()).max() <= TOL


@pytest.mark.parametrize("case", ["pre_ln", "post_ln_projected"])
def test_opt_greedy_generation_with_the_kv_cache_equals_transformers(tmp_path, case):
    """OPTForCausalLM ('model.decoder.' prefix, its head tied to the embedding, after project_out): our
    cached one-token steps choose the same tokens as transformers' greedy generate, and each step's
    logits agree with a full forward pass of transformers."""
    torch.manual_seed(0)
    vocab = train_tokenizer().get_vocab_size()
    lm = transformers.OPTForCausalLM(_opt_config(vocab, **OPT_CASES[case])).eval()
    with torch.no_grad():
        lm.model.decoder.embed_positions.weight.normal_(std=SPREAD)
    folder = _save(lm, tmp_path, byte_level_bpe)
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.can_generate
    g = m.generate("The capital of France is", max_new_tokens=6)
    steps = list(g)
    assert len(steps) == 6
    with torch.no_grad():
        out = lm.generate(torch.tensor([g.prompt_ids]), max_new_tokens=len(steps), do_sample=False,
                          eos_token_id=None, pad_token_id=1)
    assert out[0, len(g.prompt_ids):].tolist() == [s.token_id for s in steps]
    with torch.no_grad():  # the step's attention row is the last query's row of transformers' full pass
        full = lm(input_ids=out[:, :-1], output_attentions=True)
    last = torch.stack([a[0, :, -1] for a in full.attentions]).numpy()
    assert steps[-1].attention.shape == last.shape
    assert abs(steps[-1].attention - last).max() <= TOL


def test_opt_refuses_layer_norms_without_weights_in_one_line(tmp_path):
    torch.manual_seed(0)
    hf = transformers.OPTModel(_opt_config(64, layer_norm_elementwise_affine=False)).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(e.value) and "layer_norm_elementwise_affine" in str(e.value)


# ---- DistilBERT -------------------------------------------------------------------------------------

@pytest.mark.parametrize("sinusoidal", [False, True], ids=["learned", "sinusoidal"])
def test_distilbert_parity_with_padding(tmp_path, sinusoidal, linear_path):
    torch.manual_seed(0)
    vocab = VOCAB
    cfg = transformers.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=40,
                                        max_position_embeddings=64, sinusoidal_pos_embds=sinusoidal,
                                        activation="gelu", initializer_range=SPREAD, attn_implementation="eager")
    hf = transformers.DistilBertModel(cfg).eval()
    folder = _save(hf, tmp_path / "distilbert", wordpiece_vocab)
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.family == "distilbert" and not m.info.causal and m.info.num_heads == 4
    ids = torch.randint(5, vocab, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    ids[1, 7:] = 0
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_attentions=True)
    _compare(ref, _run_ours(m, input_ids=ids, attention_mask=mask), 2)
    r = m.run("The cat sat on the mat.", hidden=True)  # the saved word pieces, through the public API
    assert r.tokens[0] == "[CLS]" and r.tokens[-1] == "[SEP]" and "cat" in r.tokens
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([m.tokenizer.encode("The cat sat on the mat.", 64).ids]),
                 output_attentions=True)
    assert abs(r.hidden - ref.last_hidden_state[0].numpy()).max() <= TOL


def test_distilbert_classifier_checkpoint_loads_as_its_encoder(tmp_path):
    """DistilBertForSequenceClassification: 'distilbert.' prefix; pre_classifier and classifier left out."""
    torch.manual_seed(1)
    cfg = transformers.DistilBertConfig(vocab_size=VOCAB, dim=16, n_layers=1, n_heads=2, hidden_dim=20,
                                        max_position_embeddings=32, attn_implementation="eager")
    hf = transformers.DistilBertForSequenceClassification(cfg).eval()
    m = ax.load_model(str(_save(hf, tmp_path, wordpiece_vocab)), device="cpu")
    ids = torch.randint(5, VOCAB, (1, 9))
    with torch.no_grad():
        ref = hf.distilbert(input_ids=ids, output_attentions=True)
    _compare(ref, _run_ours(m, input_ids=ids), 1)


# ---- ELECTRA ----------------------------------------------------------------------------------------

def _electra_config(embedding_size: int, **over):
    cfg = dict(vocab_size=VOCAB, embedding_size=embedding_size, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=40, max_position_embeddings=64, hidden_act="gelu",
               initializer_range=SPREAD, attn_implementation="eager")
    cfg.update(over)
    return transformers.ElectraConfig(**cfg)


@pytest.mark.parametrize("embedding_size", [16, 32], ids=["projected", "same_width"])
def test_electra_discriminator_parity_with_padding_and_token_types(tmp_path, embedding_size, linear_path):
    """ElectraForPreTraining (the discriminator; 'electra.' prefix, discriminator_predictions left out)."""
    torch.manual_seed(0)
    hf = transformers.ElectraForPreTraining(_electra_config(embedding_size)).eval()
    m = ax.load_model(str(_save(hf, tmp_path, wordpiece_vocab)), device="cpu")
    assert m.info.family == "electra" and m.info.hidden_size == 32
    ids = torch.randint(5, VOCAB, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    ids[1, 8:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    with torch.no_grad():
        ref = hf.electra(input_ids=ids, attention_mask=mask, token_type_ids=types, output_attentions=True)
    _compare(ref, _run_ours(m, input_ids=ids, attention_mask=mask, token_type_ids=types), 2)
    r = m.run("A dog ran.")
    assert r.tokens[0] == "[CLS]" and "dog" in r.tokens


def test_electra_generator_checkpoint_loads_its_encoder(tmp_path):
    """ElectraForMaskedLM (the generator): its encoder loads; generator_predictions and the LM head are left out."""
    torch.manual_seed(2)
    hf = transformers.ElectraForMaskedLM(_electra_config(16, hidden_size=24, num_attention_heads=2)).eval()
    m = ax.load_model(str(_save(hf, tmp_path, wordpiece_vocab)), device="cpu")
    ids = torch.randint(5, VOCAB, (1, 9))
    with torch.no_grad():
        ref = hf.electra(input_ids=ids, output_attentions=True)
    _compare(ref, _run_ours(m, input_ids=ids), 2)


# ---- config faults name the fields as each family's config.json spells them ------------------------

def _edit_config(folder, **fields):
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    cfg.update(fields)
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")


def _refusal(folder) -> str:
    with pytest.raises(UserError) as e:
        ax.load_model(str(folder), device="cpu")
    assert "\n" not in str(e.value)
    return str(e.value)


def test_config_faults_are_one_line_in_each_familys_own_field_names(tmp_path):
    torch.manual_seed(0)
    opt = tmp_path / "opt"
    transformers.OPTModel(_opt_config(64)).save_pretrained(opt, safe_serialization=True)
    _edit_config(opt, num_attention_heads=5)
    message = _refusal(opt)
    assert "hidden_size 32" in message and "num_attention_heads 5" in message and "n_embd" not in message
    _edit_config(opt, num_attention_heads=4, word_embed_proj_dim=0)
    assert "word_embed_proj_dim must be a whole number >= 1" in _refusal(opt)
    distil = tmp_path / "distilbert"
    transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=16, n_layers=1, n_heads=2, hidden_dim=20, max_position_embeddings=32,
    )).save_pretrained(distil, safe_serialization=True)
    _edit_config(distil, n_heads=3)
    message = _refusal(distil)
    assert "dim 16" in message and "n_heads 3" in message
    _edit_config(distil, n_heads=2, hidden_dim=0)
    assert "hidden_dim must be a whole number >= 1" in _refusal(distil)
    electra = tmp_path / "electra"
    transformers.ElectraModel(_electra_config(16)).save_pretrained(electra, safe_serialization=True)
    _edit_config(electra, embedding_size="wide")
    assert "embedding_size must be a whole number >= 1" in _refusal(electra)
