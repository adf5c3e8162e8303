"""max_tokens=k gives exactly k tokens (special tokens included), and the run says it cut only when it did."""
from __future__ import annotations

import pytest
import torch

import attn_explorer as ax
from attn_explorer.errors import UserError

transformers = pytest.importorskip("transformers")
TEXT = "The animal didn't cross the street because it was too tired"


@pytest.fixture(scope="module")
def minilm():
    return ax.load_model("minilm", device="cpu")


@pytest.fixture(scope="module")
def textbook():
    return ax.load_model("textbook", device="cpu")


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """A random GPT-2 with a small byte-level BPE tokenizer trained here (no special tokens added)."""
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path_factory.mktemp("gpt2")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([TEXT, "the street was quiet", "a tired animal"] * 20, vocab_size=300, min_frequency=1,
                            show_progress=False)
    tok.save_model(str(folder))
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=16, n_layer=1, n_head=2, n_positions=64)
    transformers.GPT2Model(cfg).save_pretrained(folder)
    return ax.load_model(str(folder), device="cpu")


def _cut_note(r) -> bool:
    return any("truncated" in n for n in r.notes)


def test_bert_max_tokens_is_exact_with_cls_and_sep(minilm):
    full = minilm.run(TEXT)
    total = len(full.tokens)
    assert full.total_tokens == total and not full.truncated and not _cut_note(full)
    assert minilm.info.min_tokens == 3  # [CLS] w [SEP]
    for k in range(3, total + 3):
        r = minilm.run(TEXT, max_tokens=k)
        want = full.tokens if k >= total else ["[CLS]"] + full.tokens[1:k - 1] + ["[SEP]"]
        assert r.tokens == want, k
        assert r.attentions.shape[-1] == len(want)
        assert r.total_tokens == total
        assert r.truncated == (k < total) and _cut_note(r) == (k < total), (k, r.notes)
        if k < total:
            assert r.notes == [f"input truncated to its first {k} tokens (the token limit you set)"]


@pytest.mark.parametrize("k", [1, 2, 0, -3])
def test_bert_max_tokens_below_min_tokens_is_refused(minilm, k):
    with pytest.raises(UserError) as e:
        minilm.run(TEXT, max_tokens=k)
    msg = str(e.value)
    assert "\n" not in msg
    if k > 0:  # the shortest input, in a user's words
        assert msg == f"the token limit must be at least 3 for minilm (its special tokens and one word), got {k}"
    else:  # not a count at all: the argument is named
        assert "max_tokens must be a positive integer" in msg


def test_textbook_max_tokens_is_exact(textbook):
    full = textbook.run(TEXT)
    total = len(full.tokens)
    assert textbook.info.min_tokens == 1 and full.total_tokens == total and not _cut_note(full)
    for k in (1, 2, total - 1, total, total + 5):
        r = textbook.run(TEXT, max_tokens=k)
        assert r.tokens == full.tokens[:k] and r.total_tokens == total
        assert _cut_note(r) == (k < total) and r.truncated == (k < total)


def test_gpt2_max_tokens_is_exact(tiny_gpt2):
    full = tiny_gpt2.run(TEXT)
    total = len(full.tokens)
    assert tiny_gpt2.info.min_tokens == 1 and total > 3 and not _cut_note(full)
    for k in (1, 2, 3, total, total + 1):
        r = tiny_gpt2.run(TEXT, max_tokens=k)
        assert r.tokens == full.tokens[:k] and r.total_tokens == total, k
        assert _cut_note(r) == (k < total)


def test_long_text_cut_by_positions_says_why(tiny_gpt2):
    r = tiny_gpt2.run("the street was quiet " * 40)
    assert len(r.tokens) == 64 and r.total_tokens > 64
    assert r.notes == [f"input truncated to its first 64 tokens (the most {tiny_gpt2.info.name} can read)"]


def test_image_models_know_their_min_tokens():
    m = ax.load_model("textbook-vit", device="cpu")
    assert m.info.min_tokens == 2  # [CLS] and one patch
