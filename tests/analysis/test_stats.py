"""Per-head statistics on hand-built heads, and what they find in MiniLM."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.analysis.stats import (entropy_bits, findings, head_stats, neighbour_share, patch_distance,
                                          sink_share, token_distance)
from attn_explorer.errors import UserError
from tests.analysis.conftest import SENTENCES


def previous_token_head(n: int) -> np.ndarray:
    a = np.zeros((n, n))
    a[0, 0] = 1
    a[np.arange(1, n), np.arange(n - 1)] = 1
    return a


def test_entropy_of_uniform_rows_is_log2_n_and_of_one_hot_rows_zero():
    for n in (1, 2, 7, 64):
        np.testing.assert_allclose(entropy_bits(np.full((3, n), 1 / n)), np.log2(n), atol=1e-12)
    assert np.all(entropy_bits(np.eye(5)) == 0)


def test_a_previous_token_head_is_measured_as_one():
    n = 8
    a = previous_token_head(n)
    assert neighbour_share(a, -1) == 1.0 and neighbour_share(a, +1) == 0.0
    assert token_distance(a) == pytest.approx((n - 1) / n)  # row 0 looks at itself
    s = head_stats(np.stack([np.stack([a, a.T])]), np.zeros(n, dtype=bool))
    assert s.prev[0, 0] == 1.0 and s.next[0, 1] == pytest.approx(6 / 7)  # a.T: row i -> i+1, the last row -> 0
    assert s.distance_unit == "tokens"


def test_sinks_count_special_tokens_and_the_first():
    n = 6
    special = np.array([True, False, False, False, False, True])
    on_cls = np.zeros((n, n))
    on_cls[:, 0] = 1
    on_sep = np.zeros((n, n))
    on_sep[:, 5] = 1
    on_first_plain = np.zeros((n, n))
    on_first_plain[:, 0] = 1
    uniform = np.full((n, n), 1 / n)
    assert sink_share(on_cls, special) == 1 and sink_share(on_sep, special) == 1
    assert sink_share(on_first_plain, np.zeros(n, dtype=bool)) == 1  # the first token counts even if not special
    assert sink_share(uniform, special) == pytest.approx(2 / n)


def test_patch_distance_is_in_pixels():
    rows, cols, p = 3, 4, 14
    P = rows * cols
    a = np.zeros((P + 1, P + 1))  # [CLS] first
    for q in range(P):
        r, c = divmod(q, cols)
        a[1 + q, 1 + r * cols + (c + 1) % cols] = 0.5  # right neighbour (wrapping)
        a[1 + q, 0] = 0.5  # [CLS]: outside the picture, left out of the distance
    a[0, 0] = 1
    want = np.mean([14 * (1 if c < cols - 1 else cols - 1) for r in range(rows) for c in range(cols)])
    assert patch_distance(a, (rows, cols), 1, p) == pytest.approx(want)
    s = head_stats(a[None, None], np.array([True] + [False] * P), grid=(rows, cols), patch_offset=1, patch_size=p)
    assert s.distance_unit == "px" and s.distance[0, 0] == pytest.approx(want)


def test_bad_shapes_are_one_line():
    with pytest.raises(UserError, match="shaped"):
        head_stats(np.zeros((2, 3, 4)), [False] * 4)
    with pytest.raises(UserError, match="special has 3 entries for 4 tokens"):
        head_stats(np.zeros((1, 1, 4, 4)), [False] * 3)


def test_minilm_layer0_head2_is_a_previous_token_head(minilm):
    """Measured on these 10 sentences: L0 H2's largest weight is on the previous token in 100 % of rows in
    each, it is the model's clearest previous-token head, and 31 to 46 of the 72 heads are sinks (> 50 %)."""
    prev, sinks, best = [], [], []
    for s in SENTENCES:
        r = minilm.run(s)
        st = head_stats(r.attentions, r.special)
        prev.append(st.prev[0, 2])
        sinks.append((st.sink > 0.5).sum())
        best.append(np.unravel_index(np.argmax(st.prev), st.prev.shape))
    assert min(prev) >= 0.95 and np.mean(prev) >= 0.99, prev
    assert all(tuple(b) == (0, 2) for b in best), best
    assert min(sinks) >= 28, sinks  # of 72 heads
    top = findings(head_stats(r.attentions, r.special))
    assert any("L0 H2 attends most to the previous token" in f.text and (f.layer, f.head) == (0, 2) for f in top)
