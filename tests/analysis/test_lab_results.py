"""Lab results as one .npz (analysis.lab_results): an induction or a retrieval result with its check and
settings is written atomically and read back without the model, equal; the `induction` and `retrieval`
commands' files open too (their format is the same); a bad file is one UserError line."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.analysis.atlas_induction import InductionScores
from attn_explorer.analysis.lab import AblationCheck
from attn_explorer.analysis.lab_results import load_results, save_results
from attn_explorer.analysis.lab_retrieval import RetrievalResult
from attn_explorer.errors import UserError


def _check(higher: bool) -> AblationCheck:
    return AblationCheck("tiny", "needle accuracy" if not higher else "loss on the repeat (nats/token)", 0.9,
                         [(1, 0), (0, 1)], 0.1, [[(0, 0), (1, 1)], [(1, 1), (0, 0)]], [0.8, 0.85],
                         higher_is_worse=higher)


def _retrieval() -> RetrievalResult:
    return RetrievalResult("tiny", [24, 48], [0.0, 0.5, 1.0], np.array([[1.0, 0.5, 0.0], [1.0, 1.0, np.nan]]),
                           np.array([[0.0, 0.25], [0.9, 0.1]]), 12,
                           [(24, 0.0, "charlie delta", True), (48, 1.0, "x", False)],
                           np.array([[21, 22, 21], [45, 46, -1]]))


def test_a_retrieval_result_round_trips_with_its_check_and_settings(tmp_path):
    r, c = _retrieval(), _check(False)
    settings = {"needle": "alpha bravo charlie delta", "question": "\n\nQ: alpha bravo", "answer": "charlie delta",
                "max_new_tokens": 3}
    path = tmp_path / "lab.npz"
    save_results(path, r, c, settings)
    got = load_results(path)
    assert got.kind == "retrieval" and got.model == "tiny" and got.settings == settings
    g = got.result
    assert g.lengths == [24, 48] and g.depths == [0.0, 0.5, 1.0] and g.copied == 12
    np.testing.assert_array_equal(g.accuracy, r.accuracy)
    np.testing.assert_array_equal(g.scores, r.scores)
    np.testing.assert_array_equal(g.actual, r.actual)
    assert g.answers == r.answers and g.ranked() == r.ranked()
    k = got.check
    assert k.to_dict() == c.to_dict()
    with np.load(path) as z:  # what a script reads: the ranked heads, as the `retrieval` command writes them
        assert [tuple(x) for x in z["heads_ranked"]] == [(l, h) for l, h, _ in r.ranked()]
    assert not [p for p in tmp_path.iterdir() if p.name != "lab.npz"]  # no temporary file left


def test_an_induction_result_round_trips_and_without_a_check(tmp_path):
    s = InductionScores("tiny", np.array([[0.1, 0.2], [0.9, 0.0]]), 30, 2, 0)
    save_results(tmp_path / "i.npz", s, _check(True), {"top": 2})
    got = load_results(tmp_path / "i.npz")
    assert got.kind == "induction" and got.check.higher_is_worse and got.check.top_heads == [(1, 0), (0, 1)]
    assert (got.result.seq_len, got.result.batches, got.result.seed) == (30, 2, 0) and got.settings == {"top": 2}
    np.testing.assert_array_equal(got.result.scores, s.scores)
    save_results(tmp_path / "j.npz", s, None, {})
    assert load_results(tmp_path / "j.npz").check is None


def test_the_commands_files_open_too(tmp_path):
    s = InductionScores("tiny", np.array([[0.1, 0.2], [0.9, 0.0]]), 30, 2, 0)
    np.savez(tmp_path / "scores.npz", **s.arrays())  # as `python main.py induction` writes it
    got = load_results(tmp_path / "scores.npz")
    assert got.kind == "induction" and got.check is None
    r = _retrieval()
    r.actual = None
    np.savez(tmp_path / "old.npz", **r.arrays())  # a `retrieval` file from before the actual counts
    got = load_results(tmp_path / "old.npz")
    assert got.kind == "retrieval" and got.result.actual is None and got.settings == {}


def test_a_bad_file_is_one_line(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    other = tmp_path / "other.npz"
    np.savez(other, something=np.zeros(3))
    r = _retrieval()
    arrays = r.arrays()
    arrays["accuracy"] = np.zeros((3, 3))
    bent = tmp_path / "bent.npz"
    np.savez(bent, **arrays)
    for path, word in ((tmp_path / "none.npz", "no such file"), (junk, "not a readable .npz"),
                       (other, "holds no lab results"), (bent, "damaged")):
        with pytest.raises(UserError, match=word) as e:
            load_results(path)
        assert "\n" not in str(e.value)


def test_an_opened_file_without_its_settings_is_shown_but_not_checked(tmp_path):
    from types import SimpleNamespace

    from attn_explorer.session.lab import open_results_job, retrieval_check_job

    r = _retrieval()
    np.savez(tmp_path / "old.npz", **r.arrays())  # no needle, question, answer or filler recorded
    kind, run, check = open_results_job(str(tmp_path / "old.npz"))
    assert kind == "retrieval" and run.cases == [] and run.filler == "" and check is None
    model = SimpleNamespace(info=SimpleNamespace(name="tiny"))
    with pytest.raises(UserError, match="saved without their needle") as e:
        retrieval_check_job(model, run, top=1)
    assert "\n" not in str(e.value)
