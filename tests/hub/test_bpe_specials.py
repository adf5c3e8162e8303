"""Byte-level BPE folders with only vocab.json and merges.txt (OPT, BART, RoBERTa, GPT-2 as published
without tokenizer.json): the special tokens around a text are the ones transformers' tokenizer adds,
built from the same files."""
from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from attn_explorer.errors import UserError  # noqa: E402
from attn_explorer.hub.text import TextTokenizer  # noqa: E402

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
PIECES = ["t", "h", "e", "Ġ", "c", "a", "s", "Ġt", "th", "Ġth", "the", "Ġthe", "Ġc", "at", "Ġcat", "Ġs", "Ġsat"]
MERGES = ["t h", "Ġ t", "Ġt h", "th e", "Ġth e", "Ġ c", "a t", "Ġc at", "Ġ s", "Ġs at"]
# facebook/opt-125m's tokenizer_config.json: GPT2Tokenizer told to put </s> in front of every text
OPT_TOKENIZER_CONFIG = {"add_bos_token": True, "errors": "replace", "unk_token": "</s>", "eos_token": "</s>",
                        "pad_token": "<pad>", "bos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False,
                                                            "normalized": True, "rstrip": False, "single_word": False}}


def bpe_folder(tmp_path, model_type, tokenizer_config=None, special_tokens_map=None):
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(SPECIALS + PIECES)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(MERGES) + "\n")
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if special_tokens_map is not None:
        (folder / "special_tokens_map.json").write_text(json.dumps(special_tokens_map))
    return folder


@pytest.mark.parametrize("model_type,tokenizer_config,special_tokens_map,expected", [
    ("bart", None, None, ["<s>", "the", " cat", " sat", "</s>"]),
    ("roberta", None, None, ["<s>", "the", " cat", " sat", "</s>"]),
    ("bart", None, {"cls_token": "</s>"}, ["</s>", "the", " cat", " sat", "</s>"]),
    ("opt", OPT_TOKENIZER_CONFIG, None, ["</s>", "the", " cat", " sat"]),
    ("opt", None, None, ["the", " cat", " sat"]),  # GPT2Tokenizer adds nothing unless told to
    ("gpt2", None, None, ["the", " cat", " sat"]),
])
def test_specials_match_transformers(tmp_path, model_type, tokenizer_config, special_tokens_map, expected):
    folder = bpe_folder(tmp_path, model_type, tokenizer_config, special_tokens_map)
    ref = transformers.AutoTokenizer.from_pretrained(folder)("the cat sat", return_special_tokens_mask=True)
    ours = TextTokenizer.from_folder(folder)
    enc = ours.encode("the cat sat", 64)
    assert enc.ids == ref["input_ids"]
    assert enc.special == [bool(s) for s in ref["special_tokens_mask"]]
    assert enc.tokens == expected
    assert ours.min_tokens == sum(ref["special_tokens_mask"]) + 1


def test_truncation_keeps_both_ends(tmp_path):
    folder = bpe_folder(tmp_path, "bart")
    enc = TextTokenizer.from_folder(folder).encode("the cat sat", 4)
    assert enc.tokens == ["<s>", "the", " cat", "</s>"] and enc.truncated and enc.total == 5


def test_a_special_token_missing_from_the_vocabulary_is_one_line(tmp_path):
    folder = bpe_folder(tmp_path, "opt", {**OPT_TOKENIZER_CONFIG, "bos_token": "<|endoftext|>"})
    with pytest.raises(UserError, match=r"vocab\.json.*<\|endoftext\|>.*not in the vocabulary"):
        TextTokenizer.from_folder(folder)
