"""`retrieval` and `induction-check` on the command line, on the planted tiny GPT-2 (tests/analysis/atlas_planted):
an .npz / .json out and the copying head found; every bad input is one line, exit 2, and leaves no file."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.analysis.atlas_planted import INDUCTION_HEAD, make_planted_folder
from tests.cli.conftest import assert_one_error_line, files_under

PLANTED_CASE = ("--needle", "alpha bravo charlie delta", "--question", "alpha bravo", "--answer", "charlie delta",
                "--max-new-tokens", "3")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return make_planted_folder(tmp_path_factory.mktemp("planted") / "m")


@pytest.fixture(scope="module")
def scores(planted, tmp_path_factory):
    from attn_explorer.cli.main import main

    out = tmp_path_factory.mktemp("scores") / "scores.npz"
    assert main(["induction", "--model", str(planted), "--out", str(out), "--quiet", "--batches", "2",
                 "--seq-len", "30"]) == 0
    return out


def test_retrieval_writes_accuracy_scores_and_ranking(cli, planted, tmp_path):
    out = tmp_path / "retrieval.npz"
    code, stdout, err = cli("retrieval", "--model", planted, "--lengths", "24,48", "--depths", "0,0.5,1",
                            *PLANTED_CASE, "--out", out, "--quiet", "--random-sets", "3", "--top", "1")
    assert code == 0, err
    with np.load(out) as z:
        assert z["accuracy"].shape == (2, 3) and np.all(z["accuracy"] == 1.0)
        assert z["retrieval"].shape == (2, 2) and tuple(z["heads_ranked"][0]) == INDUCTION_HEAD
        assert list(z["lengths"]) == [24, 48] and list(z["depths"]) == [0.0, 0.5, 1.0]
        actual = z["actual_tokens"]  # what the model read: the filler is cut to fit, so a few under the asked
        assert actual.shape == (2, 3) and np.all(actual <= [[24], [48]]) and np.all(actual > [[12], [36]])
        assert str(z["setting_needle"]) == "alpha bravo charlie delta"
        assert str(z["setting_answer"]) == "charlie delta"
        assert z["check_top"] == 0.0 and z["check_clean"] == 1.0 and z["check_random"].shape == (3,)
    from attn_explorer.analysis.lab_results import load_results

    got = load_results(out)  # the Lab page's "Open results…" reads it, check and all
    assert got.kind == "retrieval" and got.check.top_heads == [INDUCTION_HEAD]
    assert got.settings["max_new_tokens"] == 3
    assert "top retrieval heads: L1H0" in stdout and "top heads matter more" in stdout


def test_induction_check_prints_and_writes_json(cli, planted, scores, tmp_path):
    out = tmp_path / "check.json"
    code, stdout, err = cli("induction-check", "--model", planted, "--scores", scores, "--top", "1",
                            "--seq-len", "30", "--batches", "2", "--out", out, "--quiet")
    assert code == 0, err
    d = json.loads(out.read_text())
    assert d["top_heads"] == [list(INDUCTION_HEAD)] and d["passed"] is True and len(d["random"]) == 5
    assert "top 1 off (L1H0)" in stdout


def _bad_retrieval(planted, tmp_path):
    out = tmp_path / "r.npz"
    common = ("--model", planted, "--quiet")
    return [
        (("retrieval", *common, "--out", tmp_path / "r.txt"), ".npz"),
        (("retrieval", *common, "--out", out, "--lengths", "24,x"), "--lengths"),
        (("retrieval", *common, "--out", out, "--lengths", "0"), "--lengths"),
        (("retrieval", *common, "--out", out, "--depths", "0,1.5"), "--depths"),
        (("retrieval", *common, "--out", out, "--depths", "nan"), "--depths"),
        (("retrieval", *common, "--out", out, "--max-new-tokens", "0"), "--max-new-tokens"),
        (("retrieval", *common, "--out", out, "--random-sets", "-1"), "--random-sets"),
        (("retrieval", *common, "--out", out, "--needle", "  "), "--needle"),
        (("retrieval", *common, "--out", out, "--filler-file", tmp_path / "none.txt"), "none.txt"),
        (("retrieval", *common, "--out", out, "--lengths", "100"), "positions"),
        (("retrieval", *common, "--out", out, "--lengths", "5", *PLANTED_CASE), "no room for filler"),
        (("retrieval", *common, "--out", tmp_path / "nofolder" / "r.npz"), "does not exist"),
        (("retrieval", "--model", tmp_path / "nomodel", "--out", out), "nomodel"),
    ]


def _bad_check(planted, scores, tmp_path):
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, other=np.zeros((2, 2)))
    shape = tmp_path / "shape.npz"
    np.savez(shape, induction=np.zeros((3, 2)))
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    common = ("induction-check", "--model", planted, "--quiet")
    return [
        ((*common, "--scores", tmp_path / "missing.npz"), "no such file"),
        ((*common, "--scores", wrong), "no 'induction'"),
        ((*common, "--scores", junk), "not a readable .npz"),
        ((*common, "--scores", shape), "shape (3, 2)"),  # refused after the model is read: its heads
        ((*common, "--scores", scores, "--top", "0"), "--top"),
        ((*common, "--scores", scores, "--top", "4"), "too few"),
        ((*common, "--scores", scores, "--seq-len", "1"), "--seq-len"),
        ((*common, "--scores", scores, "--seed", "x"), "--seed"),
        ((*common, "--scores", scores, "--out", tmp_path / "c.npz"), ".json"),
    ]


def test_bad_retrieval_input_is_one_line_and_no_file(cli, planted, tmp_path):
    before = files_under(tmp_path)
    for argv, word in _bad_retrieval(planted, tmp_path):
        code, _, err = cli(*argv)
        assert_one_error_line(code, err, word)
    assert files_under(tmp_path) == before


def test_bad_induction_check_input_is_one_line_and_no_file(cli, planted, scores, tmp_path):
    cases = _bad_check(planted, scores, tmp_path)
    before = files_under(tmp_path)
    for argv, word in cases:
        code, _, err = cli(*argv)
        assert_one_error_line(code, err, word)
    assert files_under(tmp_path) == before
