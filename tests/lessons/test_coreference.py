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


SMOLLM_TOKENS = ["The", " animal", " didn", "'t", " cross", " the", " street", " because", " it", " was", " too",
                 " tired", "."]  # what smollm2-135m's run gives for the primer sentence


@pytest.mark.parametrize("space", [" ", "Ġ", "▁"])
def test_decoder_tokens_with_leading_markers_find_the_primer_words(space):
    tokens = [t.replace(" ", space) for t in SMOLLM_TOKENS]
    words = co.words_of(tokens, [False] * len(tokens))
    assert [w.text for w in words] == ["The", "animal", "didn't", "cross", "the", "street", "because", "it", "was",
                                       "too", "tired", "."]
    picks = [words[co.find_word(words, t)].indices for t in co.PRIMER_WORDS]
    assert picks == [[8], [1], [6]]
    assert co.find_word(words, "THE") == 0 and co.find_word(words, " it") == 7


def test_a_causal_ranking_compares_only_what_the_query_can_see():
    rng = np.random.default_rng(1)
    N = 6
    att = np.tril(rng.random((2, 3, N, N)))  # a decoder: token i sees 0..i
    att /= att.sum(-1, keepdims=True)
    # both before the query: the plain comparison, and an honest note that nothing is hidden
    heads, hidden = co.rank_heads(att, [4], [1], [2], causal=True), co.hidden_picks([4], [1], [2], causal=True)
    assert hidden == set() and heads[0].score == pytest.approx(heads[0].to_a - heads[0].to_b)
    # the rival after the query: it can get no weight; the ranking is the weight to A alone, and says so
    assert co.hidden_picks([3], [1], [5], causal=True) == {"b"}
    heads = co.rank_heads(att, [3], [1], [5], causal=True)
    assert all(h.to_b == 0.0 for h in heads) and [h.score for h in heads] == [h.to_a for h in heads]
    # neither visible: refused in one line, not a table of +0.000
    with pytest.raises(UserError) as e:
        co.rank_heads(att, [0], [1], [2], causal=True)
    assert "\n" not in str(e.value) and "before" in str(e.value)
    # others -> A counts only the tokens that can see A (those after it)
    h = co.rank_heads(att, [4], [1], [2], causal=True)[0]
    L, H = h.layer, h.head
    assert h.others_to_a == pytest.approx(float(att[L, H, [3, 5], 1].mean()))


def test_smollm2_pickers_and_ranking_are_honest():
    m = ax.load_model("smollm2-135m", device="cpu")
    r = m.run(co.PRIMER_SENTENCE)
    words = co.words_of(r.tokens, r.special)
    q, a, b = (words[co.find_word(words, t)].indices for t in co.PRIMER_WORDS)
    assert [r.tokens[i].strip() for i in q + a + b] == ["it", "animal", "street"]
    ranking = co.find_heads(m, co.PRIMER_SENTENCE, q, a, b)
    assert ranking.causal and ranking.hidden == set()
    assert max(abs(h.score) for h in ranking.heads) > 0.05  # not every head +0.000
