"""Lesson "Order matters": attention alone does not see word order; the sinusoidal encoding adds it.

Shuffle the words and run the primer's textbook model twice: without positions (the `textbook-nopos`
built-in) each output just moves with its word, so after undoing the shuffle the outputs are the same
up to rounding. With the sinusoidal table added (the `textbook` built-in) they change. Both models are
UNTRAINED (seeded random weights): they show the mechanics, not language.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from attn_explorer.core.positional import sinusoidal_positions
from attn_explorer.core.textbook import TextbookConfig, TextbookTransformer, split_words
from attn_explorer.errors import UserError

DEFAULT_TEXT = "the cat sat on the mat because it was warm"
MAX_WORDS = 64


@lru_cache(maxsize=2)
def textbook(positional: bool) -> TextbookTransformer:
    """The built-in `textbook` (positional=True) or `textbook-nopos` model: same seed, same weights."""
    return TextbookTransformer(TextbookConfig(positional=positional)).eval()


def words_of(text: str) -> list[str]:
    """The textbook model's tokens (words and punctuation), at most MAX_WORDS; one line if unusable."""
    words = split_words(text)
    if len(words) < 2:
        raise UserError("type at least two words to shuffle")
    if len(words) > MAX_WORDS:
        raise UserError(f"at most {MAX_WORDS} words, got {len(words)}")
    return words


def outputs(words: list[str], positional: bool) -> np.ndarray:
    """(N, D) last hidden states of the textbook model for these words."""
    model = textbook(positional)
    with torch.inference_mode():
        return model(model.embed(words)).hidden[0].numpy()


def random_permutation(n: int, seed: int) -> list[int]:
    """A seeded shuffle of range(n) that moves at least one word (n >= 2)."""
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(n)
        if n < 2 or (perm != np.arange(n)).any():
            return [int(i) for i in perm]


@dataclass
class ShuffleCheck:
    words: list[str]  # the sentence's tokens, in order
    perm: list[int]  # shuffled[i] = words[perm[i]]
    shuffled: list[str]
    diff_nopos: float  # max |out(shuffled)[i] - out(words)[perm[i]]| without positions
    diff_pos: float  # the same with the sinusoidal table added
    set_diff_nopos: float  # sorted outputs compared: is the set of outputs the same?
    dim: int  # D


def _set_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference between the two sets of rows (rows sorted lexicographically first)."""
    sa = a[np.lexsort(a.T[::-1])]
    sb = b[np.lexsort(b.T[::-1])]
    return float(np.abs(sa - sb).max())


def shuffle_check(text: str, perm: list[int] | None = None, seed: int = 0) -> ShuffleCheck:
    """Run both textbook models on the words and on a shuffle of them; compare after un-shuffling."""
    words = words_of(text)
    n = len(words)
    perm = random_permutation(n, seed) if perm is None else [int(i) for i in perm]
    if sorted(perm) != list(range(n)):
        raise UserError(f"the order must use each of 0..{n - 1} once")
    shuffled = [words[i] for i in perm]
    diffs = {}
    for pos in (False, True):
        y, ys = outputs(words, pos), outputs(shuffled, pos)
        diffs[pos] = (float(np.abs(ys - y[perm]).max()), _set_diff(y, ys))
    return ShuffleCheck(words, perm, shuffled, diffs[False][0], diffs[True][0], diffs[False][1],
                        textbook(True).cfg.dim)


def encoding_table(n: int, dim: int) -> np.ndarray:
    """(n, dim) sinusoidal encoding: row p is position p's vector (core.positional)."""
    if not 1 <= n <= 1024 or dim < 2 or dim % 2 or dim > 1024:
        raise UserError("positions must be 1..1024 and the dimension an even number 2..1024")
    return sinusoidal_positions(n, dim).numpy()


def position_similarity(n: int, dim: int) -> np.ndarray:
    """(n, n) dot products PE[p] · PE[q]: near positions look alike, far ones less so."""
    pe = encoding_table(n, dim)
    return pe @ pe.T
