"""The retrieval lab on a model built for it (tests/analysis/lab_planted): layer 1 head 1 is a pure retrieval
head (from the answer position it attends to the needle's secret word and copies it through its OV circuit);
no other head copies from the needle. The lab must rank it first (score 1, every other 0), answer every
haystack, lose every answer with it off, and lose none with any other head, or a random set, off."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.analysis.lab_retrieval import (answer, bundled_filler, make_haystack, retrieval_ablation,
                                                  retrieval_scores)
from tests.analysis.lab_planted import (ANSWER, NEEDLE, QUESTION, RETRIEVAL_HEAD, SECRETS, WORDS,
                                        make_retrieval_folder)

LENGTHS, DEPTHS = (24, 48), (0.0, 0.5, 1.0)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import attn_explorer as ax

    return ax.load_model(make_retrieval_folder(tmp_path_factory.mktemp("retrieval") / "m"), device="cpu")


def haystacks(model, needle=NEEDLE, fact=ANSWER):
    fill = bundled_filler(20_000)
    return [make_haystack(needle, QUESTION, fill, n, d, model.tokenizer, answer=fact) for n in LENGTHS
            for d in DEPTHS]


@pytest.fixture(scope="module")
def cases(model):
    return haystacks(model)


def test_only_the_retrieval_head_looks_at_the_secret_from_the_answer_position(model, cases):
    import torch

    secret = WORDS.index(ANSWER)
    for c in cases:
        assert [i for i, t in enumerate(c.ids) if t == secret] == [c.needle[1] - 1]  # the filler holds no secret
        with torch.inference_mode():
            out = model.module(input_ids=torch.tensor([c.ids]), output_attentions=True)
        last = out.attentions[0, :, :, -1, :].float()  # (L, H, keys): the answer position's rows
        at = c.needle[1] - 1
        assert float(last[RETRIEVAL_HEAD][at]) > 0.9
        others = [(l, h) for l in range(2) for h in range(2) if (l, h) != RETRIEVAL_HEAD]
        assert all(int(last[lh].argmax()) != at and float(last[lh][at]) < 0.2 for lh in others)


def test_the_lab_ranks_the_retrieval_head_first_and_every_answer_is_right(model, cases):
    r = retrieval_scores(model, cases, max_new_tokens=8)
    assert r.ranked()[0][:2] == RETRIEVAL_HEAD and r.scores[RETRIEVAL_HEAD] == 1.0
    assert sorted(r.scores.ravel())[:-1] == [0.0, 0.0, 0.0]
    assert np.all(r.accuracy == 1.0) and r.copied == len(cases)
    assert all(text.strip() == ANSWER for *_, text, _ in r.answers)  # the secret, then [EOS] ends it
    other = SECRETS[2]  # whatever secret the needle holds is the one copied
    r2 = retrieval_scores(model, haystacks(model, NEEDLE.replace(ANSWER, other), other), max_new_tokens=8)
    assert np.all(r2.accuracy == 1.0) and r2.ranked()[0][:2] == RETRIEVAL_HEAD


def test_the_retrieval_head_off_loses_every_answer_and_random_heads_off_lose_none(model, cases):
    r = retrieval_scores(model, cases, max_new_tokens=8)
    c = retrieval_ablation(model, cases, r.scores, top=1, random_sets=5, seed=0, max_new_tokens=8)
    assert c.top_heads == [RETRIEVAL_HEAD] and c.clean == 1.0 and c.top == 0.0
    assert c.random == [1.0] * 5 and c.passed
    for lh in [(l, h) for l in range(2) for h in range(2) if (l, h) != RETRIEVAL_HEAD]:
        assert all(answer(model, x, 8, ablate={lh: "zero"}).correct for x in cases)
    print("planted retrieval head check:", c.summary())


def test_the_pages_job_finds_it_with_its_defaults(model):
    from attn_explorer.session.lab import Needle, retrieval_check_job, retrieval_job

    run = retrieval_job(model, list(LENGTHS), list(DEPTHS), Needle(NEEDLE, QUESTION, ANSWER))
    assert run.result.ranked()[0][:2] == RETRIEVAL_HEAD and np.all(run.result.accuracy == 1.0)
    assert np.all(run.result.actual == [[len(c.ids) for c in run.cases[:3]], [len(c.ids) for c in run.cases[3:]]])
    c = retrieval_check_job(model, run, top=1)
    assert c.top == 0.0 and c.random == [1.0] * 5
