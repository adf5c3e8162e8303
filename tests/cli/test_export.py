"""`export` as a user runs it: good files out, and for bad input one line on stderr, exit 2, nothing written.

Everything runs in-process through `main([...])`; one smoke test starts a real process.
"""
from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from attn_explorer.files import MAX_TEXT_BYTES
from tests.cli.conftest import assert_one_error_line, files_under

ROOT = Path(__file__).resolve().parents[2]
TEXT = "The animal didn't cross the street because it was too tired."


def test_export_npz_json_png(tmp_path, cli):
    for ext in ("npz", "json", "png"):
        code, out, err = cli("export", "--model", "minilm", "--text", TEXT, "--out", tmp_path / f"a.{ext}")
        assert code == 0 and f"wrote {tmp_path / f'a.{ext}'}" in out, err
    d = np.load(tmp_path / "a.npz")  # no allow_pickle needed
    assert d["attentions"].shape == (6, 12, 16, 16) and d["attentions"].dtype == np.float32
    assert d["tokens"][2] == "animal" and str(d["model"]) == "minilm" and float(d["dk_scale"]) == 1.0
    j = json.loads((tmp_path / "a.json").read_text())
    np.testing.assert_allclose(np.array(j["attentions"], dtype=np.float32), d["attentions"])
    assert j["tokens"] == list(d["tokens"])
    img = Image.open(tmp_path / "a.png")
    assert img.width > 400 and img.height > 200 and len(np.unique(np.asarray(img.convert("L")))) > 20


def test_export_text_file_image_and_options(tmp_path, cli):
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    code, _, err = cli("export", "--text-file", tmp_path / "t.txt", "--out", tmp_path / "t.npz",
                       "--dk-scale", "3", "--max-tokens", "5")
    assert code == 0, err
    d = np.load(tmp_path / "t.npz")
    assert list(d["tokens"]) == ["[CLS]", "the", "animal", "didn", "[SEP]"] and float(d["dk_scale"]) == 3.0
    Image.new("RGB", (120, 80), (90, 120, 200)).save(tmp_path / "p.png")
    code, _, err = cli("export", "--model", "textbook-vit", "--image", tmp_path / "p.png", "--out",
                       tmp_path / "i.npz", "--image-size", "64")
    assert code == 0, err
    d = np.load(tmp_path / "i.npz")
    assert list(d["grid"]) == [4, 4] and d["attentions"].shape[-1] == 17


BAD = [
    (["--text", ""], "empty"),
    (["--text", "\x00\x00\x00"], "empty"),  # NUL only: no visible character
    (["--text", "\u200b\u2060\ufeff \u200d"], "empty"),  # zero-width characters and a space
    (["--text", "\x01\x1b\x7f\t\n"], "empty"),  # control characters
    (["--text-file", "{nul}"], "empty"),
    (["--text", TEXT, "--dk-scale", "0"], "--dk-scale"),
    (["--text", TEXT, "--dk-scale", "inf"], "--dk-scale"),
    (["--text", TEXT, "--dk-scale", "-2"], "--dk-scale"),
    (["--text", TEXT, "--dk-scale", "abc"], "--dk-scale"),
    (["--text", TEXT, "--dk-scale", "3e38"], "--dk-scale"),  # finite, but the logits overflow to NaN
    (["--text", TEXT, "--max-tokens", "0"], "--max-tokens"),
    (["--text-file", "/nonexistent/t.txt"], "not found"),
    (["--text-file", "{latin1}"], "not UTF-8"),
    (["--text-file", "{folder}"], "is a folder"),
    (["--text-file", "{big}"], "larger than"),
    (["--image", "/nonexistent/p.png"], "not found"),
    (["--image", "{fake}"], "not an image"),
    (["--model", "textbook-vit", "--image", "{bomb}"], "megapixels"),  # 9000x9000, refused from its header
    (["--model", "{notmodel}", "--text", TEXT], "no config.json"),
    (["--model", "minilm", "--image", "{good}"], "text model"),
    (["--model", "./no/such/dir", "--text", TEXT], "not found"),
    (["--text", TEXT, "--device", "cuda"], "CUDA"),
    (["--text", TEXT, "--dtype", "float8"], "unknown dtype"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_one_line_exit_2(tmp_path, cli, args, message):
    (tmp_path / "fake.png").write_text("not a picture")
    (tmp_path / "notmodel").mkdir()
    (tmp_path / "notes.txt").mkdir()
    (tmp_path / "nul.txt").write_bytes(b"\x00" * 100)
    (tmp_path / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    with open(tmp_path / "big.txt", "wb") as f:  # over the text limit (2 MB is read now), sparse: nothing written
        f.truncate(MAX_TEXT_BYTES + 1)
    Image.new("RGB", (30, 30)).save(tmp_path / "good.png")
    Image.new("1", (9000, 9000)).save(tmp_path / "bomb.png")  # 81 megapixels in a 10 kB file
    names = {n: tmp_path / f for n, f in [("fake", "fake.png"), ("notmodel", "notmodel"), ("good", "good.png"),
                                           ("folder", "notes.txt"), ("nul", "nul.txt"), ("latin1", "latin1.txt"),
                                           ("big", "big.txt"), ("bomb", "bomb.png")]}
    args = [a.format(**names) for a in args]
    out = tmp_path / "out" / "x.npz"
    out.parent.mkdir()
    before = files_under(tmp_path)
    code, _, err = cli("export", *args, "--out", out)
    assert_one_error_line(code, err, message)
    assert files_under(tmp_path) == before  # nothing written, not even half


def test_bad_output_paths(tmp_path, cli):
    code, _, err = cli("export", "--text", TEXT, "--out", tmp_path / "x.txt")
    assert_one_error_line(code, err, ".npz")
    code, _, err = cli("export", "--text", TEXT, "--out", tmp_path / "nodir" / "x.npz")
    assert_one_error_line(code, err, "does not exist")
    (tmp_path / "taken.npz").mkdir()  # --out names an existing folder
    code, _, err = cli("export", "--model", "textbook", "--text", TEXT, "--out", tmp_path / "taken.npz")
    assert_one_error_line(code, err, str(tmp_path / "taken.npz"), "is a folder")
    assert list((tmp_path / "taken.npz").iterdir()) == []


def test_debug_shows_the_traceback(tmp_path, cli):
    code, _, err = cli("export", "--debug", "--text", "", "--out", tmp_path / "y.npz")
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize("code_, reason", [(errno.ENOSPC, "No space left"), (errno.EROFS, "Read-only"),
                                            (errno.EACCES, "Permission denied")])
def test_a_failed_write_keeps_the_old_file(tmp_path, cli, monkeypatch, code_, reason):
    """The disk fills up (or turns read-only) mid-write: one line naming the file and the reason, and
    the .npz that was there before is unchanged, with no temporary file left beside it."""
    import os

    target = tmp_path / "x.npz"
    target.write_bytes(b"the previous export")

    def fail(*a, **k):
        raise OSError(code_, os.strerror(code_))

    monkeypatch.setattr(np, "savez_compressed", fail)
    code, _, err = cli("export", "--model", "minilm", "--text", TEXT, "--out", target)
    assert_one_error_line(code, err, str(target), reason)
    assert target.read_bytes() == b"the previous export"
    assert [p.name for p in tmp_path.iterdir()] == ["x.npz"]


@pytest.mark.parametrize("ext", ["npz", "json", "png"])
def test_nan_attention_is_never_written(tmp_path, cli, monkeypatch, ext):
    """Logits that overflow (float16 on a GPU, or a huge scale) give NaN attention: refused, nothing written."""
    import torch

    from attn_explorer.api.model import Model

    real = Model._forward

    def overflowing(self, *a, **k):
        out, ms, logits = real(self, *a, **k)
        with torch.inference_mode():
            out.attentions[0][0, 0, 1, :] = float("nan")
        return out, ms, logits

    monkeypatch.setattr(Model, "_forward", overflowing)
    code, _, err = cli("export", "--model", "textbook", "--text", TEXT, "--out", tmp_path / f"x.{ext}")
    assert_one_error_line(code, err, "NaN")
    assert list(tmp_path.iterdir()) == []


def test_module_entry_point_smoke(tmp_path):
    """One real process: the `python -m attn_explorer` entry point, exit status and stderr as a shell sees them."""
    out = tmp_path / "y.npz"
    p = subprocess.run([sys.executable, "-m", "attn_explorer", "export", "--model", "textbook", "--text", " ",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: the text is empty; type or paste some words"], p.stderr
    assert not out.exists()


def test_help_lists_the_options(cli):
    code, out, _ = cli("export", "--help")
    assert code == 0 and "--dk-scale" in out and "--text-file" in out
