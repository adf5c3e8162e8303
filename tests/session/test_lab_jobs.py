"""session.lab: the Lab page's jobs and fields on the planted tiny GPT-2 (tests/analysis/atlas_planted: layer 0
head 0 a previous-token head, layer 1 head 0 an induction head that copies)."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.errors import UserError
from attn_explorer.session import lab as sl
from tests.analysis.atlas_planted import INDUCTION_HEAD, make_planted_folder

PLANTED_NEEDLE = sl.Needle("alpha bravo charlie delta", "alpha bravo", "charlie delta")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    import attn_explorer as ax

    return ax.load_model(str(make_planted_folder(tmp_path_factory.mktemp("planted"))), device="cpu")


def test_fields_parse_and_bad_ones_are_one_line(planted):
    info = planted.info  # 64 positions
    assert sl.parse_lengths(" 48, 24,24", info, 8) == [24, 48]
    assert sl.parse_depths("1,0,0.5") == [0.0, 0.5, 1.0]
    for text, match in (("24,abc", "whole numbers"), ("", "comma-separated"), ("0", "positive"),
                        ("57", "exceed .* 64 positions")):
        with pytest.raises(UserError, match=match) as e:
            sl.parse_lengths(text, info, 8)
        assert "\n" not in str(e.value)
    for text in ("0,1.5", "x", "-0.1", "nan"):
        with pytest.raises(UserError):
            sl.parse_depths(text)
    assert sl.default_lengths(info, 8) == "28,56"
    assert sl.top_for(info, 5) == 2 and sl.top_for(info, 1) == 1


def test_induction_job_reports_progress_and_ranks_the_planted_head(planted):
    seen = []
    s = sl.induction_job(planted, seq_len=20, batches=2, progress=lambda f, m: seen.append((f, m)))
    assert sl.ranked_heads(s.scores)[0] == INDUCTION_HEAD
    assert [f for f, _ in seen] == [0.5, 1.0] and "random sequence 2 / 2" in seen[-1][1]
    c = sl.induction_check_job(planted, s.scores, top=1, random_sets=3, seq_len=20, batches=2)
    assert c.top_heads == [INDUCTION_HEAD] and c.passed and len(c.random) == 3


def test_retrieval_job_shapes_and_the_copying_head(planted):
    seen = []
    run = sl.retrieval_job(planted, [24, 48], [0.0, 0.5, 1.0], PLANTED_NEEDLE, max_new_tokens=3,
                           progress=lambda f, m: seen.append(f))
    r = run.result
    assert r.accuracy.shape == (2, 3) and sl.ranked_heads(r.scores)[0] == INDUCTION_HEAD
    assert len(run.cases) == 6 and seen[0] == 0.0 and seen[-1] == 1.0
    c = sl.retrieval_check_job(planted, run, top=1, random_sets=2)
    assert c.top_heads == [INDUCTION_HEAD] and c.top == 0.0 and c.clean == 1.0 and c.passed


def test_a_cancelled_job_stops_at_its_next_step(planted):
    class Quit(Exception):
        pass

    def progress(f, m):
        if f > 0:
            raise Quit  # what the worker's callback does after Cancel (workers.Cancelled)

    with pytest.raises(Quit):
        sl.induction_job(planted, seq_len=20, batches=3, progress=progress)
    with pytest.raises(Quit):
        sl.retrieval_job(planted, [24], [0.0, 1.0], PLANTED_NEEDLE, max_new_tokens=3, progress=progress)
    with pytest.raises(UserError, match="exceed"):
        sl.retrieval_job(planted, [60], [0.0], PLANTED_NEEDLE, max_new_tokens=8)
    assert np.isfinite(sl.induction_job(planted, seq_len=10, batches=1).scores).all()
