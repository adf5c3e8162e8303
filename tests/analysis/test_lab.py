"""The induction and retrieval lab (issue 27 B) on the planted tiny GPT-2 of tests/analysis/atlas_planted: its
induction head (L1H0) copies by construction, so switching it off must hurt more than switching off random
heads, and the retrieval lab must find it as the head that copies the needle."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.analysis.lab import induction_ablation, random_head_sets, ranked_heads
from attn_explorer.errors import UserError
from tests.analysis.atlas_planted import INDUCTION_HEAD, PREV_HEAD, make_planted_folder


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    import attn_explorer as ax

    return ax.load_model(make_planted_folder(tmp_path_factory.mktemp("planted") / "m"), device="cpu")


@pytest.fixture(scope="module")
def scores(planted):
    from attn_explorer.analysis.atlas_induction import induction_scores

    return induction_scores(planted, seq_len=30, batches=2)


def test_ablating_the_top_induction_head_raises_the_repeat_loss_more_than_random_heads(planted, scores):
    c = induction_ablation(planted, scores, top=1, random_sets=5, seed=0, seq_len=30, batches=2)
    assert c.top_heads == [INDUCTION_HEAD]
    assert all(INDUCTION_HEAD not in hs for hs in c.random_heads) and len(c.random) == 5
    assert c.top > c.clean + 1.0  # the copy head carries the repeat: without it the loss jumps
    assert c.top_effect > c.random_effect and c.passed
    d = c.to_dict()
    assert d["random_spread"] == pytest.approx(np.std(c.random)) and d["passed"] is True
    print("planted induction check:", c.summary())


def test_the_prev_token_head_helps_induction_too_so_a_random_set_holding_it_hurts(planted, scores):
    c = induction_ablation(planted, scores, top=1, random_sets=5, seed=0, seq_len=30, batches=2)
    hurt = [v for hs, v in zip(c.random_heads, c.random) if PREV_HEAD in hs]
    calm = [v for hs, v in zip(c.random_heads, c.random) if PREV_HEAD not in hs]
    assert all(v > c.clean + 1.0 for v in hurt) and all(abs(v - c.clean) < 1e-4 for v in calm)


def test_bad_scores_and_counts_are_one_line(planted):
    with pytest.raises(UserError, match="2 layers × 2 heads"):
        induction_ablation(planted, np.zeros((3, 2)))
    with pytest.raises(UserError, match="too few for random sets"):
        induction_ablation(planted, np.zeros((2, 2)), top=3, random_sets=1)
    with pytest.raises(UserError, match="at least 1"):
        induction_ablation(planted, np.zeros((2, 2)), top=0)


def test_ranked_heads_and_random_sets():
    s = np.array([[0.1, np.nan], [0.9, 0.5]])
    assert ranked_heads(s) == [(1, 0), (1, 1), (0, 0), (0, 1)]
    sets = random_head_sets(ranked_heads(s), [(1, 0)], 2, 3, seed=1)
    assert len(sets) == 3 and all(len(set(x)) == 2 and (1, 0) not in x for x in sets)
