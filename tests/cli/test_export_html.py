"""`export --out page.html`: the one self-contained page, written atomically; bad input is one line, exit 2,
and no file."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.api.html import page_weights, read_page_data
from tests.cli.conftest import assert_one_error_line, files_under

TEXT = "the cat sat on the mat because it was warm"


def test_export_html_holds_the_same_maps_as_the_npz(tmp_path, cli):
    code, out, err = cli("export", "--model", "textbook", "--text", TEXT, "--out", tmp_path / "page.html")
    assert code == 0 and f"wrote {tmp_path / 'page.html'}" in out, err
    code, _, err = cli("export", "--model", "textbook", "--text", TEXT, "--out", tmp_path / "a.npz")
    assert code == 0, err
    exact = np.load(tmp_path / "a.npz")["attentions"]
    d = read_page_data((tmp_path / "page.html").read_text(encoding="utf-8"))
    half = np.asarray(d["maps"]["scale"])[:, :, None, None] / 255 / 2
    assert (np.abs(page_weights(d) - exact) <= half + 1e-6).all()
    assert d["labels"] == list(np.load(tmp_path / "a.npz")["tokens"])
    assert files_under(tmp_path) == {tmp_path / "page.html", tmp_path / "a.npz"}  # no temporary left


@pytest.mark.parametrize("extra,words", [
    (["--text", TEXT, "--analysis", "stats"], "--analysis needs --out ending in .npz or .json"),
    (["--text", ""], "empty"),
])
def test_export_html_bad_input_is_one_line_and_no_file(tmp_path, cli, extra, words):
    code, _, err = cli("export", "--model", "textbook", *extra, "--out", tmp_path / "page.html")
    assert_one_error_line(code, err, words)
    assert files_under(tmp_path) == set()


def test_export_html_keeps_an_old_page_when_the_run_is_refused(tmp_path, cli):
    page = tmp_path / "page.html"
    page.write_text("old", encoding="utf-8")
    code, _, err = cli("export", "--model", "textbook", "--text", TEXT, "--dk-scale", "0", "--out", page)
    assert_one_error_line(code, err, "--dk-scale")
    assert page.read_text(encoding="utf-8") == "old"
