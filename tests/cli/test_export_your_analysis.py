"""`export --analysis NAME` with your own analysis (ax.register_analysis) in the same process: its array is
saved as analysis_NAME; an unknown name, a failing function or a bad answer is one line, exit 2, no file.
(An installed package's entry point, in a new process: tests/api/test_analyses.py.)"""
from __future__ import annotations

import json

import numpy as np
import pytest

import attn_explorer as ax
from tests.cli.conftest import assert_one_error_line, files_under
from tests.analysis_registry import prev_token, registry_kept

TEXT = "the cat sat on the mat because it was tired"


@pytest.fixture(autouse=True)
def clean_registry():
    with registry_kept():
        yield


def test_export_saves_your_analysis_beside_the_attention(tmp_path, cli):
    ax.register_analysis("prev_token", prev_token)
    ax.register_analysis("Last_Row", lambda r: r.attentions[-1, 0, -1], view="tokens")
    code, out, err = cli("export", "--model", "textbook", "--text", TEXT, "--out", tmp_path / "a.npz",
                         "--analysis", "prev_token,stats,Last_Row")
    assert code == 0 and "with prev_token, stats, Last_Row" in out, err
    with np.load(tmp_path / "a.npz") as d:
        att = d["attentions"]
        np.testing.assert_allclose(d["analysis_prev_token"], prev_token(type("R", (), {"attentions": att})))
        assert d["analysis_prev_token"].shape == att.shape[:2]
        np.testing.assert_array_equal(d["analysis_Last_Row"], att[-1, 0, -1])
        assert "stats_prev" in d.files
    code, out, err = cli("export", "--model", "textbook", "--text", TEXT, "--out", tmp_path / "a.json",
                         "--analysis", "prev_token")
    assert code == 0, err
    j = json.loads((tmp_path / "a.json").read_text())
    assert np.allclose(j["analysis_prev_token"], prev_token(type("R", (), {"attentions": np.asarray(j["attentions"])})))


@pytest.mark.parametrize("name, fn, words", [
    ("nope", None, ["unknown analysis 'nope'", "registered: prev_token"]),
    ("boom", lambda r: 1 / 0, ["analysis 'boom' failed: ZeroDivisionError"]),
    ("wrong", lambda r: np.zeros(3), ["analysis 'wrong' returned shape (3,)"]),
    ("nan", lambda r: np.full(r.attentions.shape[:2], np.nan), ["analysis 'nan'", "NaN"]),
])
def test_a_bad_analysis_is_one_line_exit_2_and_no_file(tmp_path, cli, name, fn, words):
    ax.register_analysis("prev_token", prev_token)
    if fn is not None:
        ax.register_analysis(name, fn)
    code, _, err = cli("export", "--model", "textbook", "--text", TEXT, "--out", tmp_path / "x.npz",
                       "--analysis", name)
    # textbook's own "untrained" note comes first; the refusal is one error line, no traceback
    assert_one_error_line(code, "\n".join(ln for ln in err.splitlines() if not ln.startswith("note: ")), *words)
    assert "Traceback" not in err
    assert files_under(tmp_path) == set()
