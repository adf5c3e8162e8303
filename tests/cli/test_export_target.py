"""`export --target`: an encoder-decoder's three stacks of maps in one file; elsewhere one line, exit 2."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.cli.conftest import assert_one_error_line, files_under

transformers = pytest.importorskip("transformers")

from tests.hub.test_parity_bart import make_bart, save_tokenizer  # noqa: E402


@pytest.fixture
def bart(tmp_path):
    return make_bart(tmp_path)


def test_export_target_npz_and_json(tmp_path, cli, bart):
    hf, folder = bart
    out = tmp_path / "f.npz"
    code, stdout, err = cli("export", "--model", folder, "--text", "the cat sat on a mat", "--target",
                            "a dog ran far", "--out", out)
    assert code == 0 and f"wrote {out}" in stdout, err
    d = np.load(out)
    assert d["encoder_attentions"].shape == (2, 3, 8, 8)
    assert d["decoder_attentions"].shape == (3, 2, 6, 6) and d["cross_attentions"].shape == (3, 2, 6, 8)
    assert list(d["decoder_tokens"]) == ["</s>", "<s>", "a", "dog", "ran", "far"]
    np.testing.assert_array_equal(d["attentions"], d["encoder_attentions"])
    tok = save_tokenizer(folder)
    src = torch.tensor([tok.encode("the cat sat on a mat").ids])
    tgt = torch.tensor([[2] + tok.encode("a dog ran far").ids[:-1]])
    with torch.no_grad():
        ref = hf(input_ids=src, decoder_input_ids=tgt, output_attentions=True)
    np.testing.assert_allclose(d["cross_attentions"], torch.stack(ref.cross_attentions, 1)[0].numpy(), atol=1e-5,
                               rtol=0)
    np.testing.assert_allclose(d["decoder_attentions"], torch.stack(ref.decoder_attentions, 1)[0].numpy(),
                               atol=1e-5, rtol=0)
    code, _, err = cli("export", "--model", folder, "--text", "the cat", "--target", "a dog", "--out",
                       tmp_path / "f.json")
    assert code == 0, err
    j = json.loads((tmp_path / "f.json").read_text())
    assert np.array(j["cross_attentions"]).shape == (3, 2, 4, 4) and j["decoder_tokens"][0] == "</s>"


@pytest.mark.parametrize("model,extra,message", [
    ("minilm", [], "needs an encoder-decoder model"),
    ("bart", ["--out-png"], "--out ending in .npz or .json"),
    ("bart", ["--image"], "not --image"),
])
def test_target_refused_one_line_exit_2(tmp_path, cli, bart, model, extra, message):
    folder = bart[1] if model == "bart" else model
    out = tmp_path / "out" / ("x.png" if "--out-png" in extra else "x.npz")
    out.parent.mkdir()
    src = ["--image", tmp_path / "p.png"] if "--image" in extra else ["--text", "the cat"]
    if "--image" in extra:
        from PIL import Image

        Image.new("RGB", (20, 20)).save(tmp_path / "p.png")
    before = files_under(tmp_path)
    code, _, err = cli("export", "--model", folder, *src, "--target", "a dog", "--out", out)
    assert_one_error_line(code, err, message)
    assert files_under(tmp_path) == before
