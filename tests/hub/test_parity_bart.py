"""BART in core/encoder_decoder.py against transformers eager: encoder, decoder and cross-attention maps
and both last hidden states, on tiny random configs saved with save_pretrained."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity import TOL, _save, linear_path  # noqa: E402,F401

WORDS = "the cat sat on a mat dog ran far away quick brown fox jumps over lazy".split()
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # BART's ids 0..3


def bart_config(**kw):
    base = dict(vocab_size=len(SPECIALS) + len(WORDS), d_model=24, encoder_layers=2, decoder_layers=3,
                encoder_attention_heads=3, decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=29,
                max_position_embeddings=32, attn_implementation="eager", init_std=0.3)
    base.update(kw)
    return transformers.BartConfig(**base)


def save_tokenizer(folder):
    """A word-level tokenizer.json with BART's specials, wrapping each text as <s> ... </s>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    return tok


def make_bart(tmp_path, lm_head=False, **kw):
    torch.manual_seed(0)
    cls = transformers.BartForConditionalGeneration if lm_head else transformers.BartModel
    hf = cls(bart_config(**kw)).eval()
    folder = _save(hf, tmp_path, "bart")
    save_tokenizer(folder)
    return hf, folder


def _compare_seq2seq(ref, ours):
    for name, theirs, mine in (("encoder", ref.encoder_attentions, ours.attentions),
                               ("decoder", ref.decoder_attentions, ours.decoder_attentions),
                               ("cross", ref.cross_attentions, ours.cross_attentions)):
        assert mine.shape[1] == len(theirs), name
        for i, a in enumerate(theirs):
            torch.testing.assert_close(mine[:, i], a, atol=TOL, rtol=0, msg=f"{name} layer {i}")
    torch.testing.assert_close(ours.hidden, ref.encoder_last_hidden_state, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.decoder_hidden, ref.last_hidden_state, atol=TOL, rtol=0)


@pytest.mark.parametrize("scale_embedding", [False, True])
def test_bart_parity(tmp_path, scale_embedding, linear_path):
    hf, folder = make_bart(tmp_path, scale_embedding=scale_embedding)
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.family == "bart" and m.info.num_layers == 2 and m.info.num_heads == 3
    src = torch.randint(4, 20, (2, 9))
    tgt = torch.randint(4, 20, (2, 6))
    with torch.no_grad():
        ref = hf(input_ids=src, decoder_input_ids=tgt, output_attentions=True)
        ours = m.module(input_ids=src, decoder_input_ids=tgt, output_attentions=True)
    _compare_seq2seq(ref, ours)
    upper = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    assert ours.decoder_attentions[..., upper].abs().max() == 0  # the decoder never looks ahead
    assert ours.cross_attentions.shape == (2, 3, 2, 6, 9)  # target token t looks at source token s


def test_bart_parity_padded_source_and_default_decoder_input(tmp_path):
    """A padded source: no weight on its padding, in the encoder or from the decoder; with no decoder
    input both read the source shifted right (transformers' default)."""
    hf, folder = make_bart(tmp_path, lm_head=True)
    m = ax.load_model(str(folder), device="cpu")
    src = torch.randint(4, 20, (2, 9))
    mask = torch.ones_like(src)
    mask[1, 6:] = 0
    src[1, 6:] = 1
    with torch.no_grad():
        ref = hf.model(input_ids=src, attention_mask=mask, output_attentions=True)
        ours = m.module(input_ids=src, attention_mask=mask, output_attentions=True)
    for i, a in enumerate(ref.encoder_attentions):  # padded query rows are never read
        torch.testing.assert_close(ours.attentions[:, i][0], a[0], atol=TOL, rtol=0)
        torch.testing.assert_close(ours.attentions[:, i][1, :, :6], a[1, :, :6], atol=TOL, rtol=0)
    for name, theirs, mine in (("decoder", ref.decoder_attentions, ours.decoder_attentions),
                               ("cross", ref.cross_attentions, ours.cross_attentions)):
        for i, a in enumerate(theirs):
            torch.testing.assert_close(mine[:, i], a, atol=TOL, rtol=0, msg=f"{name} layer {i}")
    assert ours.cross_attentions[1, ..., 6:].abs().max() == 0
    torch.testing.assert_close(ours.decoder_hidden, ref.last_hidden_state, atol=TOL, rtol=0)


def test_bart_cross_attention_reads_the_encoder(tmp_path):
    """The comparison is sharp: cross-attention onto the decoder's own tokens instead of the encoder's
    output misses transformers' maps by far."""
    hf, folder = make_bart(tmp_path)
    m = ax.load_model(str(folder), device="cpu")
    src, tgt = torch.randint(4, 20, (1, 7)), torch.randint(4, 20, (1, 7))
    with torch.no_grad():
        ref = hf(input_ids=src, decoder_input_ids=tgt, output_attentions=True)
        memory = m.module.encoder.blocks(m.module._embed(m.module.encoder, src))[0]
        wrong = m.module.encoder.blocks(m.module._embed(m.module.encoder, tgt))[0]
        assert (memory - ref.encoder_last_hidden_state).abs().max() < TOL
        from attn_explorer.core.attention import AttentionOptions

        y = m.module._embed(m.module.decoder, tgt)
        y = m.module.decoder.layers[0].norm1(y + m.module.decoder.layers[0].self_attn(y, AttentionOptions(causal=True))[0])
        _, probs = m.module.decoder.layers[0].cross_attn(y, AttentionOptions(memory=wrong, need_weights=True))
    assert (probs - ref.cross_attentions[0]).abs().max() > 1e-3


def test_run_with_target(tmp_path):
    hf, folder = make_bart(tmp_path)
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.encoder_decoder and m.info.decoder_layers == 3 and m.info.decoder_heads == 2
    r = m.run("the cat sat on a mat", target="a dog ran far away", hidden=True)
    assert r.tokens == ["<s>", "the", "cat", "sat", "on", "a", "mat", "</s>"]
    # the decoder reads the target shifted right: the start token (</s>), then <s> a dog ran far away
    assert r.decoder_tokens == ["</s>", "<s>", "a", "dog", "ran", "far", "away"]
    assert r.decoder_special.tolist() == [True, True] + [False] * 5
    assert r.attentions.shape == (2, 3, 8, 8)
    assert r.decoder_attentions.shape == (3, 2, 7, 7) and r.cross_attentions.shape == (3, 2, 7, 8)
    tok = save_tokenizer(folder)
    src = torch.tensor([tok.encode("the cat sat on a mat").ids])
    tgt = torch.tensor([[2] + tok.encode("a dog ran far away").ids[:-1]])
    with torch.no_grad():
        ref = hf(input_ids=src, decoder_input_ids=tgt, output_attentions=True)
    np.testing.assert_allclose(r.attentions, torch.stack(ref.encoder_attentions, 1)[0].numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(r.decoder_attentions, torch.stack(ref.decoder_attentions, 1)[0].numpy(), atol=TOL,
                               rtol=0)
    np.testing.assert_allclose(r.cross_attentions, torch.stack(ref.cross_attentions, 1)[0].numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(r.hidden, ref.encoder_last_hidden_state[0].numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(r.decoder_hidden, ref.last_hidden_state[0].numpy(), atol=TOL, rtol=0)


def test_run_without_target_reads_the_source(tmp_path):
    _, folder = make_bart(tmp_path)
    m = ax.load_model(str(folder), device="cpu")
    r = m.run("the cat sat")
    assert r.decoder_tokens == ["</s>", "<s>", "the", "cat", "sat"]
    assert r.cross_attentions.shape == (3, 2, 5, 5)
    assert not r.notes
    assert "encoder's" in m.info.note and "target" in m.info.note  # the window shows the encoder's maps


def test_target_on_a_model_without_a_decoder_is_one_line():
    m = ax.load_model("textbook", device="cpu")
    with pytest.raises(UserError, match="encoder-decoder"):
        m.run("the cat sat", target="a dog")


def test_bart_decoder_heads_must_divide_the_width(tmp_path):
    hf, folder = make_bart(tmp_path)
    import json

    cfg = json.loads((folder / "config.json").read_text())
    cfg["decoder_attention_heads"] = 5
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="decoder_attention_heads 5"):
        ax.load_model(str(folder), device="cpu")


def test_decoder_maps_count_in_the_memory_guard(tmp_path, monkeypatch):
    """The encoder's maps alone fit; with the decoder's and cross-attention's they do not: one line, no run."""
    from attn_explorer.api import seq2seq
    from attn_explorer.budget import attention_maps_bytes

    _, folder = make_bart(tmp_path)
    m = ax.load_model(str(folder), device="cpu")
    encoder_only = attention_maps_bytes(8, 2, 3)  # "the cat sat on a mat" with <s> and </s>: 8 tokens
    monkeypatch.setattr(seq2seq, "default_budget", lambda device: encoder_only + 10)
    with pytest.raises(UserError, match="target tokens would need"):
        m.run("the cat sat on a mat", target="a dog ran far away")


def test_decoder_start_token_zero_loads_and_matches(tmp_path):
    """decoder_start_token_id 0 is a real token (<s> here; T5-style configs start on their pad, id 0):
    the model loads, and with no decoder input both read the source shifted right behind token 0."""
    hf, folder = make_bart(tmp_path, decoder_start_token_id=0)
    m = ax.load_model(str(folder), device="cpu")
    assert m.module.cfg.decoder_start_token_id == 0
    src = torch.randint(4, 20, (2, 7))
    with torch.no_grad():
        ref = hf(input_ids=src, output_attentions=True)
        ours = m.module(input_ids=src, output_attentions=True)
    _compare_seq2seq(ref, ours)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_decoder_start_token_must_be_a_whole_number_at_least_zero(tmp_path, bad):
    import json

    _, folder = make_bart(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["decoder_start_token_id"] = bad
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=r"^[^\n]*decoder_start_token_id must be a whole number >= 0, got"):
        ax.load_model(str(folder), device="cpu")
