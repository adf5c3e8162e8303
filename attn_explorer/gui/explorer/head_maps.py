"""The numbers the head page draws, before any widget: one head's map with or without the special tokens,
the axis titles of each stack, the count the title shows, and how many leading tokens an edit kept.

NumPy and plain lists only (no Qt), so each is checked without a window.
"""
from __future__ import annotations

import numpy as np

from attn_explorer.maths import hidden_tokens, kept_tokens, renormalise_without, without_specials
from attn_explorer.session.stacks import StackMaps


def common_prefix(a: list[str], b: list[str]) -> int:
    """How many leading tokens a and b share (an edit at the end keeps all but the last few)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def head_matrix(r, layer: int, head: int, hide_special: bool) -> tuple[np.ndarray, list[str]]:
    """The (n, n) map to draw and its token labels; with hide_special, specials dropped and rows renormalised."""
    m = r.attentions[layer, head]
    if not hide_special:
        return m, list(r.tokens)
    return without_specials(m, r.special), [r.tokens[i] for i in kept_tokens(r.special, len(r.tokens))]


def stack_matrix(m: StackMaps, layer: int, head: int, hide_special: bool
                 ) -> tuple[np.ndarray, list[str], list[str], np.ndarray]:
    """One head of a stack (rows = queries, columns = keys; cross-attention: target × source): the map to
    draw, its row and column labels, and the row indices shown. With hide_special, specials dropped on
    both axes and rows renormalised."""
    a = m.attentions[layer, head]
    R, C = a.shape
    if not hide_special:
        return a, list(m.rows), list(m.cols), np.arange(R)
    if m.square:
        keep = kept_tokens(m.row_special, R)
        return without_specials(a, m.row_special), [m.rows[i] for i in keep], [m.cols[j] for j in keep], keep
    keep_r, keep_c = kept_tokens(m.row_special, R), kept_tokens(m.col_special, C)
    cols = hidden_tokens(m.col_special)
    a = a[keep_r] if cols is None else renormalise_without(a[keep_r], cols)
    return a, [m.rows[i] for i in keep_r], [m.cols[j] for j in keep_c], keep_r


def with_sink(m: StackMaps, sinks: np.ndarray | None, layer: int, head: int, hide_special: bool,
              matrix: np.ndarray, shown_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(the map to draw, its rows' sink share or None): gpt-oss's learned sinks (RunResult.sinks) of the encoder
    stack. With the specials hidden, each row is renormalised over its kept keys AND its sink (so the sink keeps
    its share of what is shown), not over the keys alone."""
    if sinks is None or m.stack != "encoder":
        return matrix, None
    s = np.asarray(sinks[layer, head], dtype=np.float32)[shown_rows]
    if not hide_special or len(shown_rows) == len(m.rows):
        return matrix, s
    sub = np.asarray(m.attentions[layer, head], dtype=np.float32)[np.ix_(shown_rows, shown_rows)]
    total = sub.sum(-1) + s
    ok = total > 0
    return (np.divide(sub, total[:, None], out=np.zeros_like(sub), where=ok[:, None]),
            np.divide(s, total, out=np.zeros_like(s), where=ok))


AXIS_TITLES = {"encoder": ("query (row)", "key (column)"),
               "decoder": ("target token (query, row)", "target token (key, column)"),
               "cross": ("target token (query, row)", "source token (key, column)")}


def shown_count(r, n: int) -> str:
    """What an n×n map of result r shows, in words that agree with the token count elsewhere: "16×16 (all 16
    tokens)", or "256×256: 256 of 257 tokens, 1 special hidden, rows renormalised"."""
    total = r.num_tokens
    if n == total:
        return f"{n}×{n} (all {total} tokens)"
    return f"{n}×{n}: {n} of {total} tokens, {total - n} special hidden, rows renormalised"
