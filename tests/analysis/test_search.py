"""Head search finds a planted head first."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.analysis.search import head_scores, preset_target, rank_heads
from attn_explorer.errors import UserError


def noisy_attention(L=4, H=6, N=9, seed=0):
    a = np.random.default_rng(seed).random((L, H, N, N))
    return a / a.sum(-1, keepdims=True)


def test_a_planted_previous_token_head_is_found_first():
    a = noisy_attention()
    n = a.shape[-1]
    planted = np.zeros((n, n))
    planted[0, 0] = 1
    planted[np.arange(1, n), np.arange(n - 1)] = 1
    a[2, 3] = planted
    ranked = rank_heads(a, preset_target("previous", n))
    assert (ranked[0].layer, ranked[0].head) == (2, 3) and ranked[0].score == pytest.approx(1.0)
    assert ranked[1].score < 0.5  # random rows put about 1/n on the previous token
    assert len(ranked) == 24 and len(rank_heads(a, preset_target("previous", n), top=5)) == 5


def test_a_planted_cls_sink_and_a_word_pair_are_found_first():
    tokens = ["[CLS]", "the", "animal", "was", "tired", "because", "it", "slept", "[SEP]"]
    a = noisy_attention()
    a[1, 4] = 0
    a[1, 4][:, 0] = 1  # every row on [CLS]
    a[3, 0, 6] = 0
    a[3, 0, 6, 2] = 1  # "it" -> "animal"
    assert (rank_heads(a, preset_target("cls", 9))[0].layer, rank_heads(a, preset_target("cls", 9))[0].head) == (1, 4)
    best = rank_heads(a, preset_target("pair", 9, tokens, "it", "Animal"))[0]
    assert (best.layer, best.head, round(best.score, 6)) == (3, 0, 1.0)


def test_scores_are_the_share_on_the_target():
    a = noisy_attention(L=1, H=1, N=4)
    t = preset_target("next", 4)
    want = np.mean([a[0, 0, i, i + 1] for i in range(3)])
    assert head_scores(a, t)[0, 0] == pytest.approx(want)


def test_bad_targets_are_one_line():
    a = noisy_attention()
    with pytest.raises(UserError, match="no token 'dog'"):
        preset_target("pair", 9, ["x"] * 9, "x", "dog")
    with pytest.raises(UserError, match="empty"):
        head_scores(a, np.zeros((9, 9)))
    with pytest.raises(UserError, match="9×9"):
        head_scores(a, np.ones((4, 4)))
    with pytest.raises(UserError, match="unknown pattern"):
        preset_target("sideways", 9)
