"""Lesson "Order matters": without positions a shuffle only moves the outputs; with them it changes them."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.core.positional import sinusoidal_positions
from attn_explorer.errors import UserError
from attn_explorer.lessons import order


def test_shuffle_is_equivariant_without_positions_and_not_with_them():
    c = order.shuffle_check(order.DEFAULT_TEXT, seed=3)
    assert sorted(c.perm) == list(range(len(c.words))) and c.perm != sorted(c.perm)
    assert c.shuffled == [c.words[i] for i in c.perm]
    assert c.diff_nopos < 1e-5
    assert c.set_diff_nopos < 1e-5
    assert c.diff_pos > 1e-3


def test_outputs_are_the_builtin_textbook_models():
    """The lesson's two models are the `textbook` and `textbook-nopos` built-ins, weights and all."""
    import attn_explorer as ax

    for name, pos in (("textbook", True), ("textbook-nopos", False)):
        m = ax.load_model(name, device="cpu")
        assert not m.info.trained
        r = m.run(order.DEFAULT_TEXT, hidden=True)
        np.testing.assert_allclose(order.outputs(r.tokens, pos), r.hidden, atol=1e-6)


def test_a_given_order_is_used_and_checked():
    words = order.words_of("a b c")
    c = order.shuffle_check("a b c", perm=[2, 0, 1])
    assert c.shuffled == [words[2], words[0], words[1]]
    with pytest.raises(UserError):
        order.shuffle_check("a b c", perm=[0, 0, 1])
    with pytest.raises(UserError):
        order.shuffle_check("alone")


def test_random_permutation_always_moves_something():
    for seed in range(50):
        assert order.random_permutation(2, seed) == [1, 0]


def test_encoding_table_and_similarity_are_core_sinusoids():
    pe = order.encoding_table(20, 16)
    np.testing.assert_array_equal(pe, sinusoidal_positions(20, 16).numpy())
    sim = order.position_similarity(20, 16)
    np.testing.assert_allclose(sim, pe @ pe.T, rtol=1e-6)
    np.testing.assert_allclose(np.diag(sim), 8.0, rtol=1e-5)  # each row: dim/2 pairs of sin² + cos²
    assert sim[5, 6] > sim[5, 15]  # near positions are more alike than far ones
    with pytest.raises(UserError):
        order.encoding_table(10, 7)


def test_the_textbook_models_are_their_seeds_even_while_a_load_skips_init():
    """A load skips torch.nn.init while it builds (hub.built.on_meta). It once did so process-wide: a lesson
    model built then in another thread kept garbage weights, and the order lesson showed "nan"."""
    import threading

    from attn_explorer.hub.built import on_meta

    want = order.shuffle_check(order.DEFAULT_TEXT, seed=0)
    order.textbook.cache_clear()
    inside, leave = threading.Event(), threading.Event()

    def loading():
        with on_meta():  # what a load does while it builds its module
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=loading)
    t.start()
    inside.wait(10)
    threading.Timer(0.3, leave.set).start()  # the load ends a little later
    got = order.shuffle_check(order.DEFAULT_TEXT, seed=0)
    t.join()
    assert got.diff_nopos == want.diff_nopos and got.diff_pos == want.diff_pos
