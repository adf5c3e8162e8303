"""The special tokens a byte-level BPE folder without tokenizer.json (only vocab.json and merges.txt, as
OPT, BART and RoBERTa are often published) puts around a text, as transformers' tokenizer classes do:

- RoBERTa's tokenizer (model_type bart, roberta): `<s> text </s>` (its cls_token and sep_token);
- GPT-2's tokenizer (gpt2, opt and the rest): nothing, unless tokenizer_config.json says add_bos_token,
  then its bos_token in front (OPT: `</s> text`).

Token names come from tokenizer_config.json, overridden by special_tokens_map.json, as in transformers.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attn_explorer.errors import UserError

ROBERTA_STYLE = {"bart", "roberta"}  # model types transformers tokenizes with RobertaTokenizer


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _content(token: Any) -> str | None:
    """A token as tokenizer_config.json writes it: a string, or an AddedToken object with its content."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def add_bpe_specials(tok, folder: Path) -> None:
    """Give tok (a `tokenizers.Tokenizer` read from folder's vocab.json and merges.txt) the post-processor
    and special tokens transformers' tokenizer for folder's model type uses."""
    from tokenizers import AddedToken, processors

    names = {**_read(folder / "tokenizer_config.json"), **_read(folder / "special_tokens_map.json")}
    model_type = _read(folder / "config.json").get("model_type")
    if model_type in ROBERTA_STYLE:
        first, last = _content(names.get("cls_token")) or "<s>", _content(names.get("sep_token")) or "</s>"
        single, pair = f"{first} $A {last}", f"{first} $A {last} {last} $B {last}"
    elif names.get("add_bos_token") is True:
        first = last = _content(names.get("bos_token")) or "<|endoftext|>"
        single, pair = f"{first} $A", f"{first} $A {first} $B"
    else:
        return
    ids = {}
    for t in dict.fromkeys((first, last)):
        i = tok.token_to_id(t)
        if i is None:
            raise UserError(f"{folder / 'vocab.json'}: the special token {t!r} ({model_type}'s tokenizer puts it "
                            "around every text) is not in the vocabulary")
        ids[t] = i
    tok.add_special_tokens([AddedToken(t, special=True) for t in ids])  # "<s>" typed in a text stays one token
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(ids.items()))
