"""Prefix reuse (Model.run(reuse_prefix=True)): after an edit only the tokens from the first changed one run,
and the result equals a full recompute; the kept cache goes when the model, d_k or dtype changes.

Tiny random decoders saved as Hugging Face folders with the tiny trained tokenizer (tests/tiny_llama.py):
Llama with grouped-query heads, GPT-2, Gemma 3 with local layers shorter than the prompt."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.api import prefix  # noqa: E402
from tests.tiny_llama import make_llama_folder, train_tokenizer  # noqa: E402

TOL = 1e-5
PROMPT = ("The capital of France is Paris. Attention lets every token look at the tokens before it. "
          "A small model with random weights still attends to something")


_TOKENIZER = []


def _with_tokenizer(hf, folder):
    if not _TOKENIZER:
        _TOKENIZER.append(train_tokenizer())  # trained once for every folder here
    hf.save_pretrained(folder, safe_serialization=True)
    _TOKENIZER[0].save(str(folder / "tokenizer.json"))
    return folder


def _gpt2(folder):
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                  attn_implementation="eager", initializer_range=0.2)
    return _with_tokenizer(transformers.GPT2LMHeadModel(cfg).eval(), folder)


def _gemma3(folder):
    torch.manual_seed(2)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=300, hidden_size=32, intermediate_size=37, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=128, sliding_window=6, query_pre_attn_scalar=12,
        sliding_window_pattern=3, initializer_range=0.3, attn_implementation="eager")
    return _with_tokenizer(transformers.Gemma3ForCausalLM(cfg).eval(), folder)


BUILDERS = {"llama": lambda f: make_llama_folder(f, seed=3, initializer_range=0.3), "gpt2": _gpt2,
            "gemma3": _gemma3}


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            made[name] = ax.load_model(str(BUILDERS[name](tmp_path_factory.mktemp(name))), device="cpu")
        return made[name]

    return get


@pytest.fixture(autouse=True)
def nothing_kept():
    prefix.forget()
    yield
    prefix.forget()


def _fed(model, monkeypatch) -> list[int]:
    """Record how many tokens each forward pass of `model` is given."""
    fed = []
    forward = model._forward

    def counting(inputs, *a, **kw):
        fed.append(int(inputs["input_ids"].shape[1]))
        return forward(inputs, *a, **kw)

    monkeypatch.setattr(model, "_forward", counting)
    return fed


def _same(a, b, model):
    assert a.tokens == b.tokens
    np.testing.assert_allclose(a.attentions, b.attentions, atol=TOL, rtol=0)
    np.testing.assert_allclose(a.hidden, b.hidden, atol=TOL, rtol=0)
    with torch.inference_mode():
        la, lb = (model.module.logits(torch.from_numpy(r.hidden)) for r in (a, b))
    torch.testing.assert_close(la, lb, atol=TOL, rtol=0)


EDITS = {
    "typed at the end": lambda t: t + " before it, again",
    "changed in the middle": lambda t: t.replace("Paris", "Rome"),
    "deleted in the middle": lambda t: t.replace(" look at the tokens", ""),
    "deleted at the end": lambda t: t[: -len(" to something")],
}


@pytest.mark.parametrize("family", list(BUILDERS))
@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edit_reuses_the_prefix_and_equals_a_full_recompute(decoders, family, edit, monkeypatch):
    m = decoders(family)
    first = m.run(PROMPT, reuse_prefix=True, hidden=True)
    assert first.reuse == f"reused 0 of {first.num_tokens:,} tokens (nothing kept from an earlier run)"
    text = EDITS[edit](PROMPT)
    fed = _fed(m, monkeypatch)
    got = m.run(text, reuse_prefix=True, hidden=True)
    want = m.run(text, hidden=True)  # a full recompute, without the kept cache
    _same(got, want, m)
    old = [m.tokenizer.encode(PROMPT, 10_000).ids, m.tokenizer.encode(text, 10_000).ids]
    p = min(prefix.common_prefix(*old), len(old[1]) - 1)
    assert p > 5 and got.reuse == f"reused {p:,} of {got.num_tokens:,} tokens"
    assert fed == [got.num_tokens - p, want.num_tokens]  # only the tokens from the first changed one ran


@pytest.mark.parametrize("family", list(BUILDERS))
@pytest.mark.parametrize("edit", ["typed at the end", "changed in the middle"])
def test_a_lazy_run_keeps_the_prefix_q_and_lse_and_equals_a_full_recompute(decoders, family, edit, monkeypatch):
    """A long input keeps q, k and lse instead of maps (lazy): the prefix's q and lse are reused, k is the
    cache's, and every head's map computed from them equals the dense maps of a full run."""
    if "lazy" not in ax.Model.run.__code__.co_varnames:
        pytest.skip("Model.run keeps no lazy attention yet")
    m = decoders(family)
    m.run(PROMPT, reuse_prefix=True, lazy=True)
    text = EDITS[edit](PROMPT)
    fed = _fed(m, monkeypatch)
    got = m.run(text, reuse_prefix=True, lazy=True, hidden=True)
    monkeypatch.undo()
    want = m.run(text, hidden=True)
    assert got.is_lazy and got.reuse.startswith("reused ") and fed[0] < got.num_tokens - 5
    np.testing.assert_allclose(got.hidden, want.hidden, atol=TOL, rtol=0)
    L, H = want.attentions.shape[:2]
    for layer in range(L):
        for head in range(H):
            np.testing.assert_allclose(got.attention(layer, head), want.attentions[layer, head], atol=TOL, rtol=0,
                                       err_msg=f"L{layer} H{head}")
    full = m.run(text, lazy=True)  # and the store itself is a full lazy run's
    for a, b in zip(got.lazy.layers, full.lazy.layers):
        for name in ("q", "k", "lse"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=TOL, rtol=0)
    r = m.run(text + " more", reuse_prefix=True, hidden=True)  # maps kept the other way: nothing reused
    assert r.reuse.startswith("reused 0 of") and "other way" in r.reuse


def test_gemma3_prompt_is_longer_than_its_window(decoders):
    m = decoders("gemma3")
    assert m.info.layer_kinds and "local" in m.info.layer_kinds[0]
    assert m.run(PROMPT).num_tokens > 2 * m.module.cfg.sliding_windows[0]


def test_the_same_text_again_reruns_only_its_last_token(decoders, monkeypatch):
    m = decoders("llama")
    a = m.run(PROMPT, reuse_prefix=True, hidden=True)
    fed = _fed(m, monkeypatch)
    b = m.run(PROMPT, reuse_prefix=True, hidden=True)
    assert fed == [1] and b.reuse == f"reused {a.num_tokens - 1:,} of {a.num_tokens:,} tokens"
    _same(a, b, m)


def test_a_dk_change_or_a_model_switch_recomputes_everything(decoders, monkeypatch):
    llama, gpt2 = decoders("llama"), decoders("gpt2")
    llama.run(PROMPT, reuse_prefix=True)
    text = PROMPT + " again"
    r = llama.run(text, reuse_prefix=True, dk_scale=2.0, hidden=True)
    assert r.reuse.startswith("reused 0 of") and "d_k" in r.reuse
    _same(r, llama.run(text, dk_scale=2.0, hidden=True), llama)
    r = llama.run(text, reuse_prefix=True, dk_scale=2.0, dk_layers=[1])
    assert r.reuse.startswith("reused 0 of") and "d_k" in r.reuse
    gpt2.run(text, reuse_prefix=True)  # another model: what llama kept is gone
    fed = _fed(llama, monkeypatch)
    r = llama.run(text, reuse_prefix=True, dk_scale=2.0, dk_layers=[1])
    assert r.reuse == f"reused 0 of {r.num_tokens:,} tokens (another model ran last)" and fed == [r.num_tokens]


def test_a_failed_run_keeps_nothing(decoders, monkeypatch):
    m = decoders("llama")
    m.run(PROMPT, reuse_prefix=True)

    def broken(*a, **kw):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(m, "_forward", broken)
    with pytest.raises(RuntimeError):
        m.run(PROMPT + " more", reuse_prefix=True)
    monkeypatch.undo()
    assert prefix.kept_tokens() == 0
    r = m.run(PROMPT + " more", reuse_prefix=True, hidden=True)
    assert r.reuse.startswith("reused 0 of")
    _same(r, m.run(PROMPT + " more", hidden=True), m)


def test_interventions_recompute_everything(decoders):
    m = decoders("llama")
    m.run(PROMPT, reuse_prefix=True)
    if "ablate" not in m.run.__code__.co_varnames:
        pytest.skip("Model.run has no interventions yet")
    r = m.run(PROMPT, reuse_prefix=True, ablate={(0, 1): "zero"})
    assert r.reuse == f"reused 0 of {r.num_tokens:,} tokens (interventions on)" and prefix.kept_tokens() == 0


def test_an_encoder_says_every_edit_recomputes_all_tokens(minilm_or_tiny_bert):
    r = minilm_or_tiny_bert.run("Attention lets every token look at every other.", reuse_prefix=True)
    assert r.reuse == f"encoder: each edit recomputes all {r.num_tokens:,} tokens (every token sees every other)"
    assert prefix.kept_tokens() == 0


def test_without_the_flag_nothing_is_kept_or_said(decoders):
    m = decoders("gpt2")
    r = m.run(PROMPT)
    assert r.reuse == "" and prefix.kept_tokens() == 0


@pytest.fixture(scope="module")
def minilm_or_tiny_bert(tmp_path_factory):
    """A tiny random BERT with a word-piece vocabulary: an encoder that reads text."""
    folder = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(
        "attention lets every token look at other .".split()))
    (folder / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    cfg = transformers.BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=20, max_position_embeddings=32, attn_implementation="eager")
    transformers.BertModel(cfg).eval().save_pretrained(folder, safe_serialization=True)
    return ax.load_model(str(folder), device="cpu")


def test_an_argument_run_does_not_take_is_one_line():
    """run_with_hooks / run_with_cache pass run's arguments on by name: a misspelt one is one line naming it."""
    m = ax.load_model("textbook")
    for call in (lambda: m.run_with_hooks("the cat sat", {}, dk_scael=2.0),
                 lambda: m.run_with_cache("the cat sat", dk_scael=2.0)):
        with pytest.raises(ax.UserError) as e:
            call()
        assert "\n" not in str(e.value) and "'dk_scael'" in str(e.value)
