"""`export --analysis relevance`: every method's relevance beside the attention, and one line for bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest

from attn_explorer.analysis.relevance import METHODS
from tests.cli.conftest import assert_one_error_line, files_under


@pytest.fixture(scope="module")
def digit(tmp_path_factory):
    """A held-out digit of the trainer's split (seed 0) as a PNG, and its label."""
    from PIL import Image

    from attn_explorer.lessons.digits import load_digits

    d = load_digits(0)
    path = tmp_path_factory.mktemp("digit") / "digit.png"
    Image.fromarray((d.x_test[0].transpose(1, 2, 0) * 255).astype(np.uint8)).resize((64, 64)).save(path)
    return str(path), int(d.y_test[0])


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.tiny_llama import make_llama_folder

    return str(make_llama_folder(tmp_path_factory.mktemp("llama")))


def test_image_relevance_arrays_match_the_api(tmp_path, cli, digit):
    import attn_explorer as ax
    from attn_explorer.analysis.relevance import explain

    path, label = digit
    code, out, err = cli("export", "--model", "tiny-vit-digits", "--image", path, "--out", tmp_path / "r.npz",
                         "--analysis", "relevance")
    assert code == 0 and "with relevance" in out, err
    d = np.load(tmp_path / "r.npz")
    assert d["relevance"].shape == (len(METHODS), d["attentions"].shape[-1]) == (4, 17)
    assert list(d["relevance_methods"]) == list(METHODS)
    assert all(t == f'logit of class "{label}"' for t in d["relevance_targets"])
    ref = explain(ax.load_model("tiny-vit-digits"), path, "gradient_rollout")
    np.testing.assert_allclose(d["relevance"][0], ref.scores, atol=1e-6)
    code, _, err = cli("export", "--model", "tiny-vit-digits", "--image", path, "--out", tmp_path / "r.json",
                       "--analysis", "relevance,stats", "--relevance-target", "3")
    assert code == 0, err
    j = json.loads((tmp_path / "r.json").read_text())
    assert j["relevance_targets"][1] == 'logit of class "3"' and len(j["relevance"][1]) == 17


def test_decoder_relevance_explains_the_target_token(tmp_path, cli, tiny_llama):
    code, _, err = cli("export", "--model", tiny_llama, "--text", "The capital of France is", "--out",
                       tmp_path / "d.npz", "--analysis", "relevance", "--relevance-target", " capital")
    assert code == 0, err
    d = np.load(tmp_path / "d.npz")
    assert d["relevance"].shape == (4, d["attentions"].shape[-1])
    assert list(d["relevance_targets"][:2]) == ['log p(" capital" next)', 'logit of " capital" next']
    assert np.isfinite(d["relevance"]).all() and d["relevance_values"][0] < 0  # a log-probability
    code, _, err = cli("export", "--model", tiny_llama, "--text", "The capital of France is", "--out",
                       tmp_path / "e.npz", "--analysis", "relevance")  # no target: the most likely next token
    assert code == 0, err
    import attn_explorer as ax
    import torch

    m = ax.load_model(tiny_llama)
    with torch.inference_mode():
        logits = m.module.logits(m.module(**m.prepare("The capital of France is").inputs).hidden[0, -1])
    best = m.tokenizer.display([int(logits.argmax())])[0]
    e = np.load(tmp_path / "e.npz")
    assert e["relevance_targets"][0] == f'log p("{best}" next)'
    np.testing.assert_allclose(e["relevance_values"][0], float(torch.log_softmax(logits, -1).max()), atol=1e-5)


@pytest.mark.parametrize("extra, words", [
    (["--relevance-target", " Paris"], ["--relevance-target goes with --analysis relevance"]),
    (["--analysis", "relevance", "--relevance-target", " Madrid is"], ["not one: give a single token"]),
])
def test_bad_decoder_target_is_one_line_and_writes_nothing(tmp_path, cli, tiny_llama, extra, words):
    code, _, err = cli("export", "--model", tiny_llama, "--text", "The capital of Spain is", "--out",
                       tmp_path / "x.npz", *extra)
    assert_one_error_line(code, err, *words)
    assert files_under(tmp_path) == set()


def test_encoder_without_a_reference_is_one_line(tmp_path, cli):
    code, _, err = cli("export", "--model", "minilm", "--text", "A cat sat on the mat.", "--out", tmp_path / "e.npz",
                       "--analysis", "relevance")
    assert_one_error_line(code, err, "reference sentence", "--relevance-target")
    assert files_under(tmp_path) == set()
