"""`export --layers 0,5 --heads 2 --pool 1024`: chosen heads, at full resolution or pooled, for short runs and
for lazy ones (q and k kept instead of maps); bad values are one line, exit 2, and no file."""
from __future__ import annotations

import json

import numpy as np
import pytest

import attn_explorer as ax
from attn_explorer.api import model as api_model
from attn_explorer.maths import pool2d
from tests.cli.conftest import assert_one_error_line, files_under
from tests.tiny_llama import make_llama_folder

TEXT = "the cat sat on the mat because it was warm"
LONG = "The capital of France is Paris. Attention lets every token look at the tokens before it. " * 3


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("llama"), max_position_embeddings=512)


def test_chosen_heads_of_a_short_run_are_its_maps(tmp_path, cli):
    code, out, err = cli("export", "--model", "textbook", "--text", TEXT, "--out", tmp_path / "all.npz")
    assert code == 0, err
    every = np.load(tmp_path / "all.npz")["attentions"]
    code, out, err = cli("export", "--model", "textbook", "--text", TEXT, "--layers", "1,0", "--heads", "1",
                         "--out", tmp_path / "some.npz")
    assert code == 0 and "2 layers x 1 heads" in out and "full resolution" in out, err
    d = np.load(tmp_path / "some.npz")
    assert list(d["layers"]) == [1, 0] and list(d["heads"]) == [1] and int(d["pool"]) == 0
    np.testing.assert_array_equal(d["attentions"], every[[1, 0]][:, [1]])


def test_a_lazy_run_exports_pooled_and_full_heads(tmp_path, cli, llama, monkeypatch):
    monkeypatch.setattr(api_model, "DENSE_MAX_BYTES", 0)  # any run of this model keeps q and k, not maps
    dense = ax.load_model(str(llama), device="cpu").run(LONG, lazy=False)
    code, out, err = cli("export", "--model", llama, "--text", LONG, "--layers", "1", "--heads", "0,4",
                         "--pool", "16", "--out", tmp_path / "pooled.json")
    assert code == 0 and "pooled to 16 x 16" in out, err
    d = json.loads((tmp_path / "pooled.json").read_text(encoding="utf-8"))
    got = np.asarray(d["attentions"], dtype=np.float32)
    assert got.shape == (1, 2, 16, 16) and d["pool"] == 16 and d["tokens"] == dense.tokens
    for b, h in enumerate((0, 4)):
        np.testing.assert_allclose(got[0, b], pool2d(dense.attentions[1, h], 16, 16), atol=1e-6, rtol=1e-5)
    code, out, err = cli("export", "--model", llama, "--text", LONG, "--heads", "5", "--out", tmp_path / "full.npz")
    assert code == 0, err
    full = np.load(tmp_path / "full.npz")["attentions"]
    np.testing.assert_allclose(full[:, 0], dense.attentions[:, 5], atol=1e-6, rtol=1e-5)


def test_a_lazy_run_without_a_choice_is_one_line_and_no_file(tmp_path, cli, llama, monkeypatch):
    monkeypatch.setattr(api_model, "DENSE_MAX_BYTES", 0)
    for name, words in (("all.npz", "--pool 1024"), ("all.png", ".npz or .json")):
        code, _, err = cli("export", "--model", llama, "--text", LONG, "--out", tmp_path / name)
        assert_one_error_line(code, err, "kept no maps", words)
    assert files_under(tmp_path) == set()


@pytest.mark.parametrize("extra,words", [
    (["--layers", "a,b"], "--layers takes whole numbers"),
    (["--layers", "0,,1"], "--layers takes whole numbers"),
    (["--heads", "-1"], "--heads takes whole numbers"),
    (["--layers", "9"], "no layer 9"),
    (["--heads", "2,7"], "no head 7"),
    (["--pool", "0"], "--pool"),
    (["--pool", "many"], "--pool"),
])
def test_bad_choices_are_one_line_and_no_file(tmp_path, cli, extra, words):
    code, _, err = cli("export", "--model", "textbook", "--text", TEXT, *extra, "--out", tmp_path / "x.npz")
    assert_one_error_line(code, err, words)
    assert files_under(tmp_path) == set()


def test_a_choice_needs_npz_or_json(tmp_path, cli):
    code, _, err = cli("export", "--model", "textbook", "--text", TEXT, "--pool", "8", "--out", tmp_path / "x.png")
    assert_one_error_line(code, err, "--layers, --heads and --pool need --out ending in .npz or .json")
    assert files_under(tmp_path) == set()
