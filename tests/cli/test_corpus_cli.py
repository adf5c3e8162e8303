"""`corpus` on the command line: a file of sentences in, one .npz out; every bad input is one line, exit 2."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.cli.main import main


@pytest.fixture
def sentences(tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("The cat sat on the mat.\n\nA dog ran in the park.\nParis is in France.\n", encoding="utf-8")
    return f


def test_corpus_writes_statistics_and_embeddings(sentences, tmp_path, capsys):
    out = tmp_path / "c.npz"
    assert main(["corpus", "--model", "minilm", "--text-file", str(sentences), "--out", str(out),
                 "--heads", "5:0,2:1", "--quiet"]) == 0
    d = np.load(out)
    assert d["stat_entropy"].shape == (3, 6, 12) and d["heads"].tolist() == [[5, 0], [2, 1]]
    assert d["L5H0_xy"].shape == (2 * len(d["L5H0_q"]), 2) and list(d["sentences"])[1] == "A dog ran in the park."
    assert "3 sentences" in capsys.readouterr().out


@pytest.mark.parametrize("extra,message", [
    (["--heads", "9:0"], "no head L9 H0"),
    (["--heads", "x"], "layer:head"),
    (["--max-points", "0"], "max-points"),
    (["--out", "c.json"], "must end in .npz"),
])
def test_bad_input_is_one_line(sentences, tmp_path, capsys, extra, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["corpus", "--model", "minilm", "--text-file", str(sentences), "--out", "c.npz", "--quiet"]
    i = args.index("--out")
    if "--out" in extra:
        args = args[:i] + args[i + 2:]
    assert main(args + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "c.npz").exists()


def test_an_empty_or_missing_file_is_refused(tmp_path, capsys):
    empty = tmp_path / "e.txt"
    empty.write_text("\n\n", encoding="utf-8")
    for f in (empty, tmp_path / "missing.txt"):
        assert main(["corpus", "--text-file", str(f), "--out", str(tmp_path / "c.npz")]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
