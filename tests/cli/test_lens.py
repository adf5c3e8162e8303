"""`lens`: the JSON it writes (lens rows, attribution that adds up) and bad input as one line, exit 2, no file."""
from __future__ import annotations

import json

import pytest

from tests.cli.conftest import assert_one_error_line, files_under
from tests.tiny_llama import make_llama_folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("tiny-llama"), seed=4)


def test_lens_writes_json(cli, tiny, tmp_path):
    out = tmp_path / "lens.json"
    code, _, err = cli("lens", "--model", tiny, "--text", "The capital of France is", "--out", out, "--top-k", "3",
                       "--target", " capital", "--device", "cpu")
    assert code == 0, err
    d = json.loads(out.read_text())
    lens, dla = d["lens"], d["attribution"]
    n = len(lens["tokens"])
    assert len(lens["rows"]) == 3 and len(lens["top_tokens"][0]) == n and len(lens["top_tokens"][0][0]) == 3
    assert "frozen" in lens["convention"]
    assert dla["target"] == " capital" and dla["position"] == n - 1
    assert abs(dla["sum"] - dla["logit"]) < 1e-4
    assert "wrote" in err


@pytest.mark.parametrize("argv,words", [
    (["--out", "{tmp}/lens.npz"], ["--out must end in .json"]),
    (["--out", "{tmp}/nowhere/lens.json"], ["output folder does not exist"]),
    (["--out", "{tmp}/lens.json", "--top-k", "0"], ["--top-k"]),
    (["--out", "{tmp}/lens.json", "--position", "last"], ["--position"]),
    (["--out", "{tmp}/lens.json", "--position", "99"], ["position 99 does not exist"]),
    (["--out", "{tmp}/lens.json", "--target", "Paris"], ["3 tokens here"]),
])
def test_bad_input_is_one_line(cli, tiny, tmp_path, argv, words):
    before = files_under(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, _, err = cli("lens", "--model", tiny, "--text", "The capital of France is", "--device", "cpu", *argv)
    assert_one_error_line(code, err, *words)
    assert files_under(tmp_path) == before  # no half-written file


def test_an_encoder_is_refused(cli, tmp_path):
    code, _, err = cli("lens", "--model", "textbook", "--text", "the cat sat", "--out", tmp_path / "x.json",
                       "--device", "cpu")
    assert_one_error_line(code, err, "decoder")
