"""Retrieval heads by needle in a haystack (analysis.lab_retrieval) on the planted tiny GPT-2: its induction
head L1H0 copies the needle's continuation by construction, so the lab must rank it first, answer every
case, and lose the needle when it is switched off (more than with a random head off)."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.analysis.lab_retrieval import (answer, bundled_filler, make_haystack, retrieval_ablation,
                                                  retrieval_scores)
from attn_explorer.errors import UserError
from tests.analysis.atlas_planted import INDUCTION_HEAD, make_planted_folder

NEEDLE, QUESTION, FACT = "alpha bravo charlie delta", "alpha bravo", "charlie delta"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    import attn_explorer as ax

    return ax.load_model(make_planted_folder(tmp_path_factory.mktemp("planted") / "m"), device="cpu")


@pytest.fixture(scope="module")
def cases(planted):
    fill = bundled_filler(20_000)
    return [make_haystack(NEEDLE, QUESTION, fill, n, d, planted.tokenizer, answer=FACT)
            for n in (24, 48) for d in (0.0, 0.5, 1.0)]


def test_the_needle_sits_at_its_depth_and_the_question_last(planted, cases):
    tok = planted.tokenizer.tok
    for c in cases:
        assert tok.decode(c.needle_ids) == NEEDLE
        assert c.ids[-2:] == tok.encode(QUESTION).ids and len(c.ids) <= c.length
    starts = [c.needle[0] for c in cases[3:]]
    assert starts[0] == 0 and starts[0] < starts[1] < starts[2]  # depth 0, 0.5, 1 of 48 tokens
    assert cases[5].needle[1] == len(cases[5].ids) - 2  # depth 1: right before the question


def test_the_lab_finds_the_copying_head_and_answers(planted, cases):
    r = retrieval_scores(planted, cases, max_new_tokens=3)
    assert r.ranked()[0][:2] == INDUCTION_HEAD and r.scores[INDUCTION_HEAD] > 0.8
    others = [r.scores[l, h] for l in range(2) for h in range(2) if (l, h) != INDUCTION_HEAD]
    assert max(others) == 0.0
    assert r.accuracy.shape == (2, 3) and np.all(r.accuracy == 1.0)
    assert all(text.startswith(FACT) for *_, text, _ in r.answers)
    z = r.arrays()
    assert z["retrieval"].shape == (2, 2) and tuple(z["heads_ranked"][0]) == INDUCTION_HEAD
    print("planted retrieval:", r.ranked()[:2], "accuracy", r.accuracy.tolist())


def test_switching_the_copying_head_off_loses_the_needle(planted, cases):
    got = answer(planted, cases[1], 3, ablate={INDUCTION_HEAD: "zero"})
    assert not got.correct and got.hits.sum() == 0
    r = retrieval_scores(planted, cases, max_new_tokens=3)
    c = retrieval_ablation(planted, cases, r.scores, top=1, random_sets=5, seed=0, max_new_tokens=3)
    assert c.clean == 1.0 and c.top == 0.0 and c.top_heads == [INDUCTION_HEAD]
    assert c.top_effect > c.random_effect and c.passed and len(c.random) == 5
    print("planted retrieval check:", c.summary())


def test_bad_haystacks_are_one_line(planted):
    fill = bundled_filler(2_000)
    with pytest.raises(UserError, match="depth must be from 0 to 1"):
        make_haystack(NEEDLE, QUESTION, fill, 40, 1.5, planted.tokenizer)
    with pytest.raises(UserError, match="no room for filler"):
        make_haystack(NEEDLE, QUESTION, fill, 5, 0.5, planted.tokenizer)
    with pytest.raises(UserError, match="the filler has"):
        make_haystack(NEEDLE, QUESTION, "one two", 40, 0.5, planted.tokenizer)
    long = make_haystack(NEEDLE, QUESTION, fill, 63, 0.5, planted.tokenizer)
    with pytest.raises(UserError, match="exceed"):
        answer(planted, long, 8)
    with pytest.raises(UserError, match="no haystacks"):
        retrieval_scores(planted, [])


def test_the_actual_token_counts_are_recorded_beside_the_asked_lengths(planted, cases):
    r = retrieval_scores(planted, cases, max_new_tokens=3)
    want = np.array([[len(c.ids) for c in cases[:3]], [len(c.ids) for c in cases[3:]]])
    assert r.actual.shape == (2, 3) and r.actual.dtype.kind == "i"
    np.testing.assert_array_equal(r.actual, want)
    assert np.all(r.actual <= np.array(r.lengths)[:, None]) and np.any(r.actual < np.array(r.lengths)[:, None])
    assert all(c.tokens == len(c.ids) for c in cases)
    z = r.arrays()
    np.testing.assert_array_equal(z["actual_tokens"], want)
    assert list(z["lengths"]) == [24, 48]  # the asked ones stay where they were
