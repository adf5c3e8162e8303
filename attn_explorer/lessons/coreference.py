"""Lesson "Finding the 'it' head": which head links "it" to "animal" rather than to "street"?

In the primer's sentence "The animal didn't cross the street because it was too tired.", "it" means
the animal. For every (layer, head) of a model we read one number from a single forward pass:

    score = weight("it" -> "animal") - weight("it" -> "street")

and rank the heads by it. Any sentence and any three words work: a query Q, a target A and a rival B.
A word cut into pieces ("tired" -> "tire", "##d") counts as one: the query's rows are averaged and
the weights to a target's pieces are added up.

In a decoder (a causal model: GPT-2, Llama, SmolLM2) a token sees only itself and the tokens before
it. A target after the query gets no weight from it in any head, so comparing it would rank every
head by a zero: `hidden_picks` names such picks, the ranking then compares only what the query can
see (A alone, when B is hidden), and picks the query cannot see at all are refused in one line.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attn_explorer.errors import UserError

PRIMER_SENTENCE = "The animal didn't cross the street because it was too tired."
PRIMER_WORDS = ("it", "animal", "street")  # query, target A, rival B


@dataclass
class Word:
    text: str  # the word as the pieces spell it ("tired")
    indices: list[int]  # its token positions
    special: bool  # [CLS], [SEP] and the like

    @property
    def label(self) -> str:
        where = str(self.indices[0]) if len(self.indices) == 1 else f"{self.indices[0]}–{self.indices[-1]}"
        return f"{self.text}  (token {where})" if len(self.indices) == 1 else f"{self.text}  (tokens {where})"


SPACE_MARKS = ("Ġ", "▁", " ")  # a word's first piece in GPT-2/RoBERTa, SentencePiece, and decoded BPE tokens


def _starts_word(token: str) -> bool:
    return token.startswith(SPACE_MARKS) or token[:1].isspace()


def _bare(token: str) -> str:
    if token.startswith("##"):
        return token[2:]
    return token.lstrip("".join(SPACE_MARKS)).strip()


def words_of(tokens: list[str], special: list[bool] | np.ndarray) -> list[Word]:
    """Group word pieces into words: "##x" (BERT) joins the word before; with leading-space markers
    ("Ġ" GPT-2/RoBERTa, "▁" SentencePiece, or a plain space as a decoder's tokens are shown) a piece
    without one joins the word before. Punctuation stands alone."""
    special = [bool(s) for s in special]
    marked = any(_starts_word(t) for t in tokens)
    words: list[Word] = []
    for i, (t, sp) in enumerate(zip(tokens, special)):
        bare = _bare(t)
        punct = bare != "" and not any(c.isalnum() for c in bare)
        joins = (t.startswith("##") or (marked and not _starts_word(t) and not punct))
        if words and joins and not sp and not words[-1].special and not _is_punct(words[-1].text):
            words[-1].text += bare
            words[-1].indices.append(i)
        else:
            words.append(Word(bare if not sp else t, [i], sp))
    return words


def _is_punct(text: str) -> bool:
    return text != "" and not any(c.isalnum() for c in text)


def find_word(words: list[Word], text: str) -> int | None:
    """Index in `words` of the first word spelled `text` (case-insensitive, space markers ignored), or None."""
    want = _bare(text).casefold()
    for i, w in enumerate(words):
        if not w.special and w.text.casefold() == want:
            return i
    return None


@dataclass
class HeadScore:
    layer: int
    head: int
    score: float  # to_a - to_b
    to_a: float  # weight from the query to the target A (summed over its pieces)
    to_b: float  # weight from the query to the rival B
    others_to_a: float  # mean weight to A from every other token: is the query special, or does everyone look at A?


def head_scores(attentions: np.ndarray, query: list[int], a: list[int], b: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(weight to A, weight to B), each (L, H), from attentions (L, H, N, N): query rows averaged,
    target columns summed."""
    att = np.asarray(attentions, dtype=np.float64)
    if att.ndim != 4 or att.shape[-1] != att.shape[-2]:
        raise UserError(f"attentions must be (layers, heads, N, N), got shape {att.shape}")
    n = att.shape[-1]
    for name, idx in (("query", query), ("target A", a), ("rival B", b)):
        if not idx or any(not 0 <= i < n for i in idx):
            raise UserError(f"the {name} must be tokens 0..{n - 1}")
    if set(a) & set(b):
        raise UserError("the target A and the rival B must be different words")
    rows = att[:, :, query, :].mean(axis=2)  # (L, H, N)
    return rows[..., a].sum(-1), rows[..., b].sum(-1)


def hidden_picks(query: list[int], a: list[int], b: list[int], causal: bool) -> set[str]:
    """Which of "a" and "b" the query cannot see: in a causal model, a word with a piece after the
    query's first piece (every piece of the query must see every piece of the word)."""
    if not causal:
        return set()
    first = min(query)
    return {name for name, idx in (("a", a), ("b", b)) if max(idx) > first}


def rank_heads(attentions: np.ndarray, query: list[int], a: list[int], b: list[int],
               causal: bool = False) -> list[HeadScore]:
    """Every (layer, head), best first: the most weight to A rather than to B. In a causal model a pick
    the query cannot see is left out of the score (B hidden: the score is the weight to A alone); when
    it sees neither, or not A, that is one UserError line."""
    to_a, to_b = head_scores(attentions, query, a, b)
    hidden = hidden_picks(query, a, b, causal)
    if "a" in hidden:
        both = "neither the target A nor the rival B" if "b" in hidden else "the target A"
        raise UserError(f"in a decoder a token sees only the tokens before it, and the query (token {min(query)}) "
                        f"comes before {both}: pick words that come before the query")
    if "b" in hidden:
        to_b = np.zeros_like(to_b)  # what the model gives it, exactly: no weight, in every head
    score = to_a - to_b
    att = np.asarray(attentions)
    sees_a = max(a) if causal else -1  # a causal token sees A only from A's last piece on
    others = [i for i in range(att.shape[-1]) if i not in set(query) | set(a) | set(b) and i > sees_a]
    base = att[:, :, others][..., a].sum(-1).mean(-1) if others else np.zeros_like(score)  # (L, H)
    order = np.lexsort((np.arange(score.size), -score.ravel()))  # ties: earlier head first
    L, H = score.shape
    return [HeadScore(int(i // H), int(i % H), float(score.flat[i]), float(to_a.flat[i]), float(to_b.flat[i]),
                      float(base.flat[i])) for i in order]


@dataclass
class Ranking:
    model: str  # ModelInfo.name
    trained: bool
    tokens: list[str]  # the tokens the model saw
    query: list[int]
    a: list[int]
    b: list[int]
    heads: list[HeadScore]  # best first
    causal: bool = False  # a decoder: each token sees only the tokens before it
    hidden: set[str] = field(default_factory=set)  # "b" when the rival comes after the query (see hidden_picks)

    @property
    def best(self) -> HeadScore:
        return self.heads[0]


def find_heads(model, text: str, query: list[int], a: list[int], b: list[int], run_kw: dict | None = None) -> Ranking:
    """Worker function (state.submit): run `model` (an api Model) once on text and rank its heads."""
    if model.info.modality != "text":
        raise UserError(f"{model.info.name} is an image model; load a text model (minilm) to find the 'it' head")
    kw = {k: v for k, v in (run_kw or {}).items() if k in ("max_tokens", "dk_scale", "dk_layers")}
    r = model.run(text, **kw)
    causal = bool(getattr(model.info, "causal", False))
    heads = rank_heads(r.attentions, list(query), list(a), list(b), causal=causal)
    return Ranking(model.info.name, bool(model.info.trained), list(r.tokens), list(query), list(a), list(b), heads,
                   causal, hidden_picks(list(query), list(a), list(b), causal))
