"""Tokenizers from a model folder, through the `tokenizers` library (no transformers import)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attn_explorer.errors import UserError


@dataclass
class Encoded:
    ids: list[int]
    tokens: list[str]
    special: list[bool]
    type_ids: list[int]
    truncated: bool  # the text was longer than allowed
    total: int  # tokens of the whole text, special tokens included


def _display(tok: str) -> str:
    """Byte-level BPE marks a leading space with 'Ġ' and a newline with 'Ċ'; show them readably."""
    return tok.replace("Ġ", " ").replace("Ċ", "\\n") if tok else tok


def _chat_template(folder: Path) -> str | None:
    """The chat template of a chat model: chat_template.jinja, else tokenizer_config.json's chat_template."""
    jinja, cfg = folder / "chat_template.jinja", folder / "tokenizer_config.json"
    try:
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        if cfg.is_file():
            t = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template")
            return t if isinstance(t, str) else None
    except (OSError, ValueError):
        return None
    return None


class TextTokenizer:
    """Wraps a `tokenizers.Tokenizer` with its own special tokens added (e.g. [CLS] ... [SEP])."""

    def __init__(self, tok, byte_level: bool = False, chat_template: str | None = None):
        self.tok = tok
        self.tok.no_padding()
        self.tok.no_truncation()
        self.byte_level = byte_level
        self.chat_template = chat_template  # Jinja text from tokenizer_config.json (chat models)

    def display(self, ids: list[int]) -> list[str]:
        """Each id as the token the views show (byte-level marks made readable)."""
        toks = [self.tok.id_to_token(int(i)) or "" for i in ids]
        return [_display(t) for t in toks] if self.byte_level else toks

    def single_token_id(self, token: str | int, vocab_size: int | None = None) -> int:
        """The vocabulary id of one token, given as an int id (7592) or as its text (" Mary", with its
        leading space where the text has one; a byte-level token as the views show it, "ĠMary" or " Mary").
        Text that is not exactly one token is one UserError line naming its pieces."""
        if isinstance(token, bool):
            raise UserError(f"give the token as text (for example ' Paris') or as an id, not {token!r}")
        size = self.tok.get_vocab_size() if vocab_size is None else int(vocab_size)
        if isinstance(token, int) or type(token).__module__ == "numpy":
            t = int(token)
            if not 0 <= t < size:
                raise UserError(f"token id {t} does not exist; the vocabulary has ids 0..{size - 1}")
            return t
        if not isinstance(token, str) or token == "":
            raise UserError("the target token is empty: give it as text (for example ' Paris') or as an id")
        direct = self.tok.token_to_id(token)
        if direct is not None:
            return int(direct)
        ids = self.tok.encode(token, add_special_tokens=False).ids
        if len(ids) == 1:
            return int(ids[0])
        pieces = " + ".join(repr(t) for t in self.display(ids))
        raise UserError(f"{token!r} is {len(ids)} tokens here ({pieces or 'none'}), not one: give a single token, "
                        "with its leading space where the text has one")

    @classmethod
    def from_folder(cls, folder: Path) -> "TextTokenizer | None":
        from tokenizers import Tokenizer

        f = folder / "tokenizer.json"
        if f.exists():
            try:
                tok = Tokenizer.from_file(str(f))
            except Exception as e:  # the library raises plain Exception subclasses
                raise UserError(f"{f} could not be read as a tokenizer ({e})") from None
            # the pre-tokenizer's own JSON, not the whole file parsed again (Gemma's is 33 MB: 2 s)
            pre = tok.pre_tokenizer
            return cls(tok, byte_level=pre is not None and b"ByteLevel" in pre.__getstate__(),
                       chat_template=_chat_template(folder))
        if (folder / "vocab.txt").exists():
            from tokenizers import BertWordPieceTokenizer

            lower = True
            tc = folder / "tokenizer_config.json"
            if tc.exists():
                lower = json.loads(tc.read_text(encoding="utf-8")).get("do_lower_case", True)
            return cls(BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=lower)._tokenizer)
        if (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
            from tokenizers import ByteLevelBPETokenizer

            from attn_explorer.hub.specials import add_bpe_specials

            tok = ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))._tokenizer
            add_bpe_specials(tok, folder)  # <s> ... </s> (BART, RoBERTa), </s> ... (OPT), as transformers
            return cls(tok, byte_level=True)
        return None

    @property
    def min_tokens(self) -> int:
        """The shortest encoding with one real token: the special tokens added around a text, plus one."""
        return self.tok.num_special_tokens_to_add(False) + 1

    def encode(self, text: str, max_len: int) -> Encoded:
        """Tokens of text with the special tokens, cut to exactly max_len in all when the text has more
        (BERT: [CLS], the first max_len - 2 word pieces, [SEP]). max_len must be at least min_tokens."""
        if max_len < self.min_tokens:
            raise UserError(f"at least {self.min_tokens} tokens are needed (the special tokens and one word), got {max_len}")
        # One pass over the text: its tokens without the special ones, cut, then the specials added, as
        # the tokenizer's own truncation does (which would tokenise a long text a second time).
        self.tok.no_truncation()
        body = self.tok.encode(text, add_special_tokens=False)
        total = len(body.ids) + self.tok.num_special_tokens_to_add(False)
        if total > max_len:
            body.truncate(max_len - self.tok.num_special_tokens_to_add(False))
        enc = self.tok.post_process(body)
        del body  # a long text's tokens, cut off (held as the encoding's overflow)
        truncated = len(enc.ids) < total
        tokens = [_display(t) for t in enc.tokens] if self.byte_level else list(enc.tokens)
        return Encoded(list(enc.ids), tokens, [bool(s) for s in enc.special_tokens_mask], list(enc.type_ids), truncated,
                       total)
