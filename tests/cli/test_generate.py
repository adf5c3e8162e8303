"""`generate` on the command line, with a tiny random Llama folder."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")

from tests.cli.conftest import assert_one_error_line, files_under  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("llama"))


def test_generate_prints_text_and_writes_npz(cli, folder, tmp_path):
    out = tmp_path / "gen.npz"
    code, stdout, err = cli("generate", "--model", folder, "--prompt", "The capital of", "--max-new-tokens", "5",
                            "--out", out, "--device", "cpu")
    assert code == 0, err
    d = np.load(out)
    S = len(d["token_ids"])
    assert 1 <= S <= 5 and stdout.rstrip("\n") == str(d["text"])
    n0 = len(d["prompt_ids"])
    assert d["attentions"].shape == (S, 2, 6, n0 + S - 1)
    assert d["lengths"].tolist() == list(range(n0, n0 + S))
    for i, n in enumerate(d["lengths"]):  # each real row sums to one; the padding is zero
        np.testing.assert_allclose(d["attentions"][i, :, :, :n].sum(-1), 1.0, atol=1e-5)
        assert not d["attentions"][i, :, :, n:].any()
    assert d["top_probs"].shape == (S, 10) and (np.diff(d["top_probs"], axis=1) <= 0).all()
    assert d["token_ids"].tolist() == d["top_ids"][:, 0].tolist()  # greedy


def test_generate_json_chat_with_sampling(cli, folder, tmp_path):
    out = tmp_path / "gen.json"
    args = ("generate", "--model", folder, "--prompt", "Hi", "--chat", "--max-new-tokens", "4", "--temperature",
            "1.2", "--top-k", "5", "--seed", "7", "--out", out, "--device", "cpu")
    code, stdout, err = cli(*args)
    assert code == 0, err
    d = json.loads(out.read_text())
    assert d["prompt"].startswith("<|im_start|>user\nHi<|im_end|>")
    assert [len(a[0][0]) for a in d["attentions"]] == d["lengths"]
    assert all(len(p) == 5 for p in d["top_probs"])
    code2, stdout2, _ = cli(*args)
    assert stdout2 == stdout  # same seed, same text


@pytest.mark.parametrize("extra,words", [
    (("--max-new-tokens", "0"), "--max-new-tokens"),
    (("--temperature", "-2"), "temperature"),
    (("--top-k", "x"), "--top-k"),
    (("--seed", "abc"), "seed"),
    (("--seed", "-1"), "seed"),
    (("--out", "gen.png"), ".npz"),
])
def test_bad_input_is_one_line_and_writes_nothing(cli, folder, tmp_path, extra, words):
    before = files_under(tmp_path)
    code, _, err = cli("generate", "--model", folder, "--prompt", "x", *extra)
    assert_one_error_line(code, err, words)
    assert files_under(tmp_path) == before


def test_an_encoder_is_refused(cli, tmp_path):
    import transformers

    transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=20)).save_pretrained(tmp_path)
    code, _, err = cli("generate", "--model", tmp_path, "--prompt", "hello")
    assert_one_error_line(code, err, "not a decoder")


def test_export_of_a_decoder_is_causal(cli, folder, tmp_path):
    out = tmp_path / "prompt.npz"
    code, _, err = cli("export", "--model", folder, "--text", "The capital of France is Paris.", "--out", out,
                       "--device", "cpu")
    assert code == 0, err
    att = np.load(out)["attentions"]
    L, H, N, _ = att.shape
    assert (L, H) == (2, 6) and N > 3
    assert not np.triu(att, k=1).any()  # nothing above the diagonal: no token sees a later one
    np.testing.assert_allclose(att.sum(-1), 1.0, atol=1e-5)
