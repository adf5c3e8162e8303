"""Head search: rank every head by how much weight it puts where a target pattern says.

A target is an (N, N) matrix T ≥ 0; only rows with some target count, each normalised to sum to 1.
A head's score is the mean over those rows of Σ_j α_ij T_ij: the share of its attention that lands on
the target keys (1 = exactly the pattern, 0 = never). Presets build T from a rule:
"previous" (i → i−1), "next" (i → i+1), "cls" (every row → token 0, the [CLS] sink), "self" (i → i),
and "pair" (a query word → a key word, as in "it → animal").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attn_explorer.errors import UserError

PRESETS = {
    "previous": "previous token (i → i−1)",
    "next": "next token (i → i+1)",
    "cls": "[CLS] sink (every token → the first)",
    "self": "itself (i → i)",
    "pair": "query word → key word (e.g. it → animal)",
}


@dataclass
class HeadScore:
    layer: int
    head: int
    score: float  # share of the head's weight on the target, over the target's rows


def plain(token: str) -> str:
    """A token as a word: without the tokenizers' space marks (Ġ, ▁, ##) and case."""
    return token.strip().lstrip("Ġ▁").removeprefix("##").lower()


def find_token(tokens: list[str], word: str, role: str) -> list[int]:
    """Indices of the tokens that read as `word`; a UserError names the role when there is none."""
    w = plain(word)
    if not w:
        raise UserError(f"give a {role} word")
    hits = [i for i, t in enumerate(tokens) if plain(t) == w]
    if not hits:
        raise UserError(f"no token {word!r} in the input (for the {role})")
    return hits


def preset_target(name: str, n: int, tokens: list[str] | None = None, query: str = "", key: str = "") -> np.ndarray:
    """The (n, n) target matrix of a preset; "pair" needs the tokens and a query and key word."""
    t = np.zeros((n, n), dtype=np.float32)
    i = np.arange(n)
    if name == "previous":
        t[i[1:], i[1:] - 1] = 1
    elif name == "next":
        t[i[:-1], i[:-1] + 1] = 1
    elif name == "cls":
        t[:, 0] = 1
    elif name == "self":
        t[i, i] = 1
    elif name == "pair":
        if tokens is None or len(tokens) != n:
            raise UserError("a query → key search needs the input's tokens")
        for q in find_token(tokens, query, "query"):
            t[q, find_token(tokens, key, "key")] = 1
    else:
        raise UserError(f"unknown pattern {name!r}: choose from {', '.join(PRESETS)}")
    return t


def head_scores(att, target) -> np.ndarray:
    """(L, H, N, N) and an (N, N) target -> (L, H) scores in [0, 1]."""
    a = np.asarray(att)
    t = np.asarray(target, dtype=np.float64)
    if a.ndim != 4 or t.shape != a.shape[-2:]:
        raise UserError(f"the target is {t.shape[0] if t.ndim else 0}×{t.shape[-1] if t.ndim else 0} "
                        f"but the attention is {a.shape[-2]}×{a.shape[-1]}")
    if np.any(t < 0) or not np.all(np.isfinite(t)):
        raise UserError("a target pattern needs finite weights of at least 0")
    s = t.sum(axis=-1, keepdims=True)
    rows = s[:, 0] > 0
    if not rows.any():
        raise UserError("the target pattern is empty: no query has a key to look for")
    tn = t[rows] / s[rows]  # (R, N), rows sum to 1
    return np.einsum("lhrn,rn->lh", a[:, :, rows, :].astype(np.float64), tn) / rows.sum()


def rank_heads(att, target, top: int | None = None) -> list[HeadScore]:
    """Every head, best match first (ties: lower layer, then lower head)."""
    scores = head_scores(att, target)
    L, H = scores.shape
    order = sorted(((l, h) for l in range(L) for h in range(H)), key=lambda lh: (-scores[lh], lh))
    ranked = [HeadScore(l, h, float(scores[l, h])) for l, h in order]
    return ranked if top is None else ranked[:top]
