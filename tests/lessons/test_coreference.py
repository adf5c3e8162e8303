"""Lesson "Finding the 'it' head": ranking heads by weight to A rather than B."""
from __future__ import annotations

import numpy as np
import pytest

import attn_explorer as ax
from attn_explorer.errors import UserError
from attn_explorer.lessons import coreference as co


def test_planted_head_ranks_first():
    rng = np.random.default_rng(0)
    L, H, N = 3, 4, 9
    att = rng.random((L, H, N, N))
    att /= att.sum(-1, keepdims=True)
    q, a, b = [6], [2, 3], [5]
    att[1, 2, 6] = 0.0
    att[1, 2, 6, 2], att[1, 2, 6, 3] = 0.3, 0.3  # A is two pieces: 0.6 in all
    att[1, 2, 6, 0] = 0.4
    heads = co.rank_heads(att, q, a, b)
    assert (heads[0].layer, heads[0].head) == (1, 2)
    assert heads[0].to_a == pytest.approx(0.6) and heads[0].to_b == 0.0 and heads[0].score == pytest.approx(0.6)
    assert len(heads) == L * H and len({(h.layer, h.head) for h in heads}) == L * H
    scores = [h.score for h in heads]
    assert scores == sorted(scores, reverse=True)
    to_a, to_b = co.head_scores(att, q, a, b)
    assert heads[-1].score == pytest.approx(float((to_a - to_b).min()))


def test_query_pieces_are_averaged():
    att = np.zeros((1, 1, 4, 4))
    att[0, 0, 2, 0] = 1.0
    att[0, 0, 3, 1] = 1.0
    h = co.rank_heads(att, [2, 3], [0], [1])[0]
    assert h.to_a == pytest.approx(0.5) and h.to_b == pytest.approx(0.5)


def test_bad_picks_are_one_line():
    att = np.full((1, 1, 3, 3), 1 / 3)
    with pytest.raises(UserError):
        co.rank_heads(att, [0], [1], [1])
    with pytest.raises(UserError):
        co.rank_heads(att, [0], [5], [1])


def test_word_pieces_are_grouped():
    w = co.words_of(["[CLS]", "too", "tire", "##d", ".", "[SEP]"], [True, False, False, False, False, True])
    assert [(x.text, x.indices) for x in w] == [("[CLS]", [0]), ("too", [1]), ("tired", [2, 3]), (".", [4]),
                                                ("[SEP]", [5])]
    g = co.words_of(["The", "Ġanimal", "Ġdidn", "'t", "Ġtired", "."], [False] * 6)
    assert [x.text for x in g] == ["The", "animal", "didn't", "tired", "."]
    assert co.find_word(w, "TIRED") == 2 and co.find_word(w, "cat") is None


def test_minilm_ranking_for_the_primer_sentence():
    m = ax.load_model("minilm", device="cpu")
    r = m.run(co.PRIMER_SENTENCE)
    words = co.words_of(r.tokens, r.special)
    q, a, b = (words[co.find_word(words, t)].indices for t in co.PRIMER_WORDS)
    ranking = co.find_heads(m, co.PRIMER_SENTENCE, q, a, b)
    best = ranking.best
    assert 0 <= best.layer < m.info.num_layers and 0 <= best.head < m.info.num_heads
    assert len(ranking.heads) == m.info.num_layers * m.info.num_heads
    assert ranking.tokens == r.tokens
    # the score is read from the run's own attention
    np.testing.assert_allclose(best.to_a, r.attentions[best.layer, best.head, q[0], a].sum(), rtol=1e-6)
    assert best.score > 0.3  # a trained model has a head that resolves "it" to the animal


def test_image_model_is_refused_in_one_line():
    with pytest.raises(UserError):
        co.find_heads(ax.load_model("textbook-vit", device="cpu"), "x", [0], [1], [2])


def test_others_to_a_is_the_mean_weight_from_every_other_token():
    att = np.zeros((1, 1, 5, 5))
    att[0, 0, :, 1] = [0.2, 0.0, 0.4, 0.9, 0.6]  # token 1 is A, 2 is B, 3 is the query
    h = co.rank_heads(att, [3], [1], [2])[0]
    assert h.to_a == pytest.approx(0.9)
    assert h.others_to_a == pytest.approx((0.2 + 0.6) / 2)  # tokens 0 and 4
