"""`export --image IMG --text PROMPT --analysis NAME` on a vision-language model (tiny random Qwen3-VL and LLaVA
folders): rollout, norms and stats over the decoder's image and text tokens, relevance of the next token, your own
analysis on the run; what cannot apply (AttnLRP on Qwen3-VL's DeepStack) refuses in one line and writes nothing."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis.rollout import rollout_layers  # noqa: E402
from attn_explorer.analysis.stats import head_stats  # noqa: E402
from tests.api.vlm_tiny import qwen3_vl_folder  # noqa: E402
from tests.cli.conftest import assert_one_error_line, files_under  # noqa: E402
from tests.hub.test_parity_vlm import PROMPTS, make, picture  # noqa: E402

PROMPT = "the cat <image> sat on"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("qwen3_vl")
    qwen3_vl_folder(folder)
    img = folder / "cat.png"
    Image.fromarray(picture()).save(img)
    return folder, img


def test_rollout_norms_stats_and_yours_on_a_picture_and_a_prompt(tmp_path, cli, qwen):
    folder, img = qwen
    ax.register_analysis("peak", lambda r: r.attentions.max(axis=(2, 3)))
    try:
        code, out, err = cli("export", "--model", folder, "--image", img, "--text", PROMPT, "--out",
                             tmp_path / "v.npz", "--analysis", "rollout,stats,peak")
    finally:
        ax.unregister_analysis("peak")
    assert code == 0 and "with rollout, stats, peak" in out, err
    d = np.load(tmp_path / "v.npz")
    att = d["attentions"]
    L, H, N, _ = att.shape
    assert (L, H) == (3, 6) and "image_token_positions" in d.files
    np.testing.assert_allclose(d["rollout"], rollout_layers(att), rtol=1e-6)
    s = head_stats(att, d["special"])  # the decoder's tokens: distances in tokens, not the tower's patch grid
    np.testing.assert_array_equal(d["stats_entropy"], s.entropy)
    assert str(d["stats_distance_unit"]) == "tokens"
    np.testing.assert_allclose(d["analysis_peak"], att.max(axis=(2, 3)))


@pytest.mark.parametrize("name, words", [("norms", ("norms", "not supported yet", "vision-language")),
                                         ("relevance", ("AttnLRP", "DeepStack"))])
def test_what_cannot_apply_is_one_line_and_no_file(tmp_path, cli, qwen, name, words):
    folder, img = qwen
    code, _, err = cli("export", "--model", folder, "--image", img, "--text", PROMPT, "--out", tmp_path / "r.npz",
                       "--analysis", f"rollout,{name}")
    assert_one_error_line(code, err, *words)
    assert files_under(tmp_path) == set()


def test_relevance_of_the_next_token_over_image_and_text(tmp_path, cli):
    from PIL import Image

    make(tmp_path / "m", "llava")
    Image.fromarray(picture()).save(tmp_path / "cat.png")
    code, out, err = cli("export", "--model", tmp_path / "m", "--image", tmp_path / "cat.png", "--text",
                         PROMPTS["llava"], "--out", tmp_path / "r.npz", "--analysis", "relevance")
    assert code == 0 and "with relevance" in out, err
    d = np.load(tmp_path / "r.npz")
    N = d["attentions"].shape[2]
    assert d["relevance"].shape == (len(d["relevance_methods"]), N) and np.isfinite(d["relevance"]).all()
    assert all("next" in t for t in d["relevance_targets"].tolist())
