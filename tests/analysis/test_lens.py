"""The logit lens and direct logit attribution on tiny random decoders (Llama, GPT-2, Gemma 3): the pieces add
up to the real logit under the frozen-norm convention, and the lens's last row is the real next-token distribution."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis import lens  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

IDS = [5, 17, 3, 42, 8, 23, 11, 30, 2, 19, 7]


def _spread_norms(hf, std=0.3):
    """Random init leaves the norms at 1 (or Gemma's at 0): make them count, so a dropped γ fails."""
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or "ln" in name:
                p.add_(torch.randn_like(p) * std)
    return hf


def _gpt2(folder):
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=64,
                                  attn_implementation="eager", initializer_range=0.2)
    hf = _spread_norms(transformers.GPT2LMHeadModel(cfg).eval())
    hf.save_pretrained(folder, safe_serialization=True)
    return folder


def _gemma3(folder):
    torch.manual_seed(2)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=37, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, sliding_window=5, query_pre_attn_scalar=12,
        sliding_window_pattern=3, initializer_range=0.3, attn_implementation="eager")
    hf = _spread_norms(transformers.Gemma3ForCausalLM(cfg).eval())
    hf.save_pretrained(folder, safe_serialization=True)
    return folder


def _llama(folder):
    return make_llama_folder(folder, seed=3, num_hidden_layers=3, tie_word_embeddings=False)


BUILDERS = {"llama": _llama, "gpt2": _gpt2, "gemma3": _gemma3}


@pytest.fixture(scope="session")
def decoders(tmp_path_factory):
    """name -> loaded tiny decoder (each built and saved once)."""
    made = {}

    def get(name):
        if name not in made:
            folder = BUILDERS[name](tmp_path_factory.mktemp(name))
            made[name] = ax.load_model(str(folder), device="cpu")
        return made[name]

    return get


def _real_logits(m, ids):
    with torch.inference_mode():
        out = m.module(input_ids=torch.tensor([ids]))
        return m.module.logits(out.hidden)[0].float()


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_logit_decomposition_is_exact(decoders, family):
    m = decoders(family)
    if family == "gemma3":  # the sandwich norms and q/k norms are what this case is about
        assert m.module.cfg.sandwich_norms and m.module.cfg.qk_norm
    logits = _real_logits(m, IDS)
    for pos, target in ((-1, None), (4, 9)):
        a = lens.logit_attribution(m, IDS, position=pos, target=target)
        t = int(logits[pos].argmax()) if target is None else target
        assert a.target_id == t
        assert abs(a.logit - float(logits[pos, t])) < 1e-4
        assert abs(a.total - a.logit) < 1e-4, (a.total, a.logit)
        assert a.heads.shape == (m.info.num_layers, m.info.num_heads)
        assert np.abs(a.heads).max() > 1e-3 and np.abs(a.mlps).max() > 1e-3  # every kind of piece takes part


def test_attribution_moves_when_a_head_is_switched_off(decoders):
    """Zeroing one head's slice of W_O zeroes exactly its direct contribution and leaves the sum exact."""
    m = decoders("llama")
    before = lens.logit_attribution(m, IDS, target=9)
    w = m.module.blocks.layers[2].attn.out.weight
    d = m.module.blocks.layers[2].attn.head_dim
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w[:, d:2 * d] = 0  # layer 2 (the last), head 1
        after = lens.logit_attribution(m, IDS, target=9)
    finally:
        with torch.no_grad():
            w.copy_(saved)
    assert abs(before.heads[2, 1]) > 1e-4 and after.heads[2, 1] == 0
    # the earlier heads write the same vectors; only the final norm's frozen scale moved (RMSNorm: one factor)
    big = np.abs(before.heads[:2]) > 1e-3
    ratio = after.heads[:2][big] / before.heads[:2][big]
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-4)
    assert abs(ratio[0] - 1) > 1e-4
    assert abs(after.total - after.logit) < 1e-4


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_lens_last_row_is_the_models_next_token_distribution(decoders, family):
    m = decoders(family)
    probs = torch.softmax(_real_logits(m, IDS), -1).numpy()
    for norm in lens.NORMS:
        r = lens.logit_lens(m, IDS, k=5, norm=norm)
        L = m.info.num_layers
        assert r.top_ids.shape == (L + 1, len(IDS), 5) and len(r.row_names) == L + 1
        order = np.argsort(-probs, axis=-1)[:, :5]
        np.testing.assert_array_equal(r.top_ids[-1], order)
        np.testing.assert_allclose(r.top_probs[-1], np.take_along_axis(probs, order, -1), atol=1e-5)
        np.testing.assert_allclose(r.final_prob[-1], probs.max(-1), atol=1e-5)
        assert not np.allclose(r.top_probs[0], r.top_probs[-1])  # the embeddings' row is another reading


def test_lens_in_blocks_of_rows_is_the_same(decoders, monkeypatch):
    """A long input's lens is read a few rows at a time (no (N, V) array); the blocks change nothing."""
    m = decoders("gemma3")
    whole = lens.logit_lens(m, IDS)
    monkeypatch.setattr(lens, "LENS_BLOCK", 3 * 64)  # three rows of the 64-token vocabulary at a time
    blocks = lens.logit_lens(m, IDS)
    np.testing.assert_array_equal(blocks.top_ids, whole.top_ids)
    np.testing.assert_allclose(blocks.top_probs, whole.top_probs, atol=1e-6)
    np.testing.assert_allclose(blocks.final_prob, whole.final_prob, atol=1e-6)


def test_lens_progress_reaches_the_end(decoders):
    seen = []
    lens.logit_lens(decoders("gpt2"), IDS, progress=lambda f, msg: seen.append(f))
    assert seen[-1] == 1.0 and len(seen) == 4 and seen == sorted(seen)


def test_lens_reads_text_and_a_target_token(decoders):
    m = decoders("llama")
    r = lens.logit_lens(m, "The capital of France is")
    assert r.tokens == m.run("The capital of France is").tokens
    a = lens.logit_attribution(m, "The capital of France is", target=" capital")
    assert a.target == " capital" and a.target_id == m.tokenizer.tok.encode(" capital").ids[0]
    with pytest.raises(UserError, match="3 tokens here"):
        lens.logit_attribution(m, "The capital", target="Paris")


def test_head_tokens_are_the_heads_direct_logits(decoders):
    """The token a head promotes most is one whose attribution to that head is the largest over the vocabulary."""
    m = decoders("llama")
    up, down = lens.head_tokens(m, IDS, None, 2, 1, k=4)
    assert len(up) == 4 and len(down) == 4
    assert up[0][1] >= up[-1][1] > down[-1][1] >= down[0][1]
    ids = [i for i in range(m.tokenizer.tok.get_vocab_size()) if lens.token_texts(m, [i])[0] == up[0][0]]
    a = lens.logit_attribution(m, IDS, target=ids[0])
    assert abs(a.heads[2, 1] - up[0][1]) < 1e-4


@pytest.mark.parametrize("bad,match", [(dict(k=0), "top-k"), (dict(norm="odd"), "lens norm")])
def test_lens_bad_options(decoders, bad, match):
    with pytest.raises(UserError, match=match):
        lens.logit_lens(decoders("gpt2"), IDS, **bad)


def test_encoders_are_refused():
    m = ax.load_model("textbook", device="cpu")
    with pytest.raises(UserError, match="decoder"):
        lens.logit_lens(m, "the cat sat")
