"""Lesson "Attention without a softmax": the DeltaNet head's map is core.deltanet's (A @ V = the delta rule's
output), signed and not row-stochastic; the softmax head's is core's causal softmax; the decay's envelope and the
last row; the cost table's growth; bad input refused in one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_explorer.errors import UserError
from attn_explorer.lessons import no_softmax as ns


def test_both_heads_on_the_primer_sentence():
    c = ns.compare()
    n = len(c.tokens)
    assert c.tokens[1] == "animal" and c.softmax.shape == c.deltanet.shape == (n, n)
    np.testing.assert_allclose(c.softmax.sum(-1), 1.0, atol=1e-12)
    assert (c.softmax >= 0).all() and np.allclose(np.triu(c.softmax, 1), 0)
    assert np.allclose(np.triu(c.deltanet, 1), 0) and (c.deltanet < 0).any() and c.negative > 0
    assert not np.allclose(c.row_sums, 1.0)  # not probabilities
    assert c.reproduces < 1e-12  # A @ V is the layer's output


def test_the_map_is_the_plain_recurrence_run_on_one_hot_values():
    """Independent of the lesson's chunked path: core.deltanet.delta_rule token by token on V = I."""
    from attn_explorer.core.deltanet import delta_rule

    c = ns.compare("a b c d e f g", decay=0.7, beta=0.6, seed=4)
    gen = torch.Generator().manual_seed(4)
    x = torch.stack([ns.word_vector(w, ns.DIM) for w in c.tokens]).double()
    w_q, w_k, _ = (torch.randn(ns.DIM, ns.DIM, generator=gen, dtype=torch.float64) / ns.DIM ** 0.5 for _ in range(3))
    q = torch.nn.functional.normalize(x @ w_q, dim=-1)[None, None] / ns.DIM ** 0.5
    k = torch.nn.functional.normalize(x @ w_k, dim=-1)[None, None]
    n = len(c.tokens)
    a, _ = delta_rule(q, k, torch.eye(n, dtype=torch.float64)[None, None], torch.full((1, 1, n), np.log(0.7), dtype=torch.float64),
                      torch.full((1, 1, n), 0.6, dtype=torch.float64))
    np.testing.assert_allclose(c.deltanet, a[0, 0].numpy(), atol=1e-12)


@pytest.mark.parametrize("decay, beta", [(0.9, None), (0.5, 1.0), (1.0, 0.3)])
def test_the_last_row_sits_under_the_bound(decay, beta):
    c = ns.compare(decay=decay, beta=beta, seed=1)
    b = c.beta[::-1]  # by distance: the key s = n-1-distance
    assert (c.last_row <= b * c.envelope + 1e-12).all()


def test_the_decay_bounds_the_reach():
    fast, slow = ns.compare(decay=0.3, beta=1.0), ns.compare(decay=1.0, beta=1.0)
    np.testing.assert_allclose(fast.envelope, 0.3 ** fast.distance)
    assert fast.last_row[0] > 0
    far = fast.distance >= 6
    assert fast.last_row[far].max() < 1e-2 * fast.last_row.max()  # the decay has wiped out the far tokens
    assert slow.last_row[far].max() > 10 * fast.last_row[far].max()  # without it they still count
    assert (slow.envelope == 1).all()


def test_the_cost_table_grows_as_said():
    rows = ns.cost_table(d=128, lengths=(1000, 2000))
    a, b = rows
    assert b.softmax_flops == pytest.approx(4 * a.softmax_flops)  # n²
    assert b.recurrent_flops == pytest.approx(2 * a.recurrent_flops)  # n
    assert b.recurrent_memory == a.recurrent_memory == 128 * 128  # flat
    assert b.softmax_memory == pytest.approx(2 * a.softmax_memory)
    assert b.map_cells == 2000 * 2001 / 2


@pytest.mark.parametrize("kw, words", [(dict(text="  "), "at least one word"), (dict(decay=0.0), "decay"),
                                       (dict(beta=1.5), "β"), (dict(text="w " * 60), "at most 48 words")])
def test_bad_input_is_one_line(kw, words):
    with pytest.raises(UserError, match=words):
        ns.compare(**kw)
