"""`export --analysis rollout,norms,stats`: the analyses' arrays beside the attention, and one line for bad names."""
from __future__ import annotations

import json

import numpy as np
import pytest

from attn_explorer.analysis.rollout import rollout_layers
from attn_explorer.analysis.stats import head_stats
from tests.cli.conftest import assert_one_error_line, files_under

TEXT = "The animal didn't cross the street because it was too tired."


def test_export_adds_rollout_norms_and_stats(tmp_path, cli):
    code, out, err = cli("export", "--model", "minilm", "--text", TEXT, "--out", tmp_path / "a.npz",
                         "--analysis", "rollout, norms,stats")
    assert code == 0 and "with rollout, norms, stats" in out, err
    d = np.load(tmp_path / "a.npz")
    att = d["attentions"]
    assert d["rollout"].shape == (6, 16, 16) and d["norms"].shape == (6, 12, 16, 16)
    assert d["value_norms"].shape == (6, 12, 16)
    np.testing.assert_allclose(d["rollout"], rollout_layers(att), rtol=1e-6)
    np.testing.assert_allclose(d["norms"], att * d["value_norms"][:, :, None, :], rtol=1e-4, atol=1e-7)
    s = head_stats(att, d["special"])
    np.testing.assert_array_equal(d["stats_prev"], s.prev)
    assert d["stats_prev"][0, 2] == 1.0 and str(d["stats_distance_unit"]) == "tokens"
    code, out, err = cli("export", "--model", "minilm", "--text", TEXT, "--out", tmp_path / "a.json",
                         "--analysis", "stats")
    assert code == 0, err
    j = json.loads((tmp_path / "a.json").read_text())
    assert "rollout" not in j and np.allclose(j["stats_entropy"], d["stats_entropy"])


def test_without_analysis_the_file_is_as_before(tmp_path, cli):
    code, _, err = cli("export", "--model", "minilm", "--text", TEXT, "--out", tmp_path / "b.npz")
    assert code == 0, err
    assert set(np.load(tmp_path / "b.npz").files) == {"attentions", "tokens", "special", "model", "dk_scale"}


def test_image_stats_measure_distance_in_pixels(tmp_path, cli):
    from tests.gui.conftest import sample

    code, _, err = cli("export", "--model", "textbook-vit", "--image", sample("coffee"), "--out", tmp_path / "i.npz",
                       "--analysis", "stats,rollout")
    assert code == 0, err
    d = np.load(tmp_path / "i.npz")
    assert str(d["stats_distance_unit"]) == "px" and d["rollout"].shape[1] == d["attentions"].shape[-1]


@pytest.mark.parametrize("value, out, words", [
    ("rollout,attention", "x.npz", ["unknown analysis 'attention'", "rollout, norms, stats"]),
    (" , ", "x.npz", ["--analysis needs at least one"]),
    ("stats", "x.png", ["--analysis needs --out ending in .npz or .json"]),
])
def test_bad_analysis_is_one_line_and_writes_nothing(tmp_path, cli, value, out, words):
    code, _, err = cli("export", "--model", "minilm", "--text", TEXT, "--out", tmp_path / out, "--analysis", value)
    assert_one_error_line(code, err, *words)
    assert files_under(tmp_path) == set()
