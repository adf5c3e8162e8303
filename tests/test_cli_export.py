"""`export` as a user runs it: good files out, and for bad input one line on stderr, exit 2, nothing written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from attn_explorer.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The animal didn't cross the street because it was too tired."


def test_export_npz_json_png(tmp_path):
    for ext in ("npz", "json", "png"):
        assert main(["export", "--model", "minilm", "--text", TEXT, "--out", str(tmp_path / f"a.{ext}")]) == 0
    d = np.load(tmp_path / "a.npz")  # no allow_pickle needed
    assert d["attentions"].shape == (6, 12, 16, 16) and d["attentions"].dtype == np.float32
    assert d["tokens"][2] == "animal" and str(d["model"]) == "minilm" and float(d["dk_scale"]) == 1.0
    j = json.loads((tmp_path / "a.json").read_text())
    np.testing.assert_allclose(np.array(j["attentions"], dtype=np.float32), d["attentions"])
    assert j["tokens"] == list(d["tokens"])
    img = Image.open(tmp_path / "a.png")
    assert img.width > 400 and img.height > 200 and len(np.unique(np.asarray(img.convert("L")))) > 20


def test_export_text_file_image_and_options(tmp_path):
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    assert main(["export", "--text-file", str(tmp_path / "t.txt"), "--out", str(tmp_path / "t.npz"),
                 "--dk-scale", "3", "--max-tokens", "5"]) == 0
    d = np.load(tmp_path / "t.npz")
    assert list(d["tokens"]) == ["[CLS]", "the", "animal", "didn", "[SEP]"] and float(d["dk_scale"]) == 3.0
    Image.new("RGB", (120, 80), (90, 120, 200)).save(tmp_path / "p.png")
    assert main(["export", "--model", "textbook-vit", "--image", str(tmp_path / "p.png"), "--out",
                 str(tmp_path / "i.npz"), "--image-size", "64"]) == 0
    d = np.load(tmp_path / "i.npz")
    assert list(d["grid"]) == [4, 4] and d["attentions"].shape[-1] == 17


BAD = [
    (["--text", ""], "empty"),
    (["--text", TEXT, "--dk-scale", "0"], "--dk-scale"),
    (["--text", TEXT, "--dk-scale", "inf"], "--dk-scale"),
    (["--text", TEXT, "--dk-scale", "-2"], "--dk-scale"),
    (["--text", TEXT, "--dk-scale", "abc"], "--dk-scale"),
    (["--text", TEXT, "--max-tokens", "0"], "--max-tokens"),
    (["--text-file", "/nonexistent/t.txt"], "not found"),
    (["--image", "/nonexistent/p.png"], "not found"),
    (["--image", "{fake}"], "not an image"),
    (["--model", "{notmodel}", "--text", TEXT], "no config.json"),
    (["--model", "minilm", "--image", "{good}"], "text model"),
    (["--model", "./no/such/dir", "--text", TEXT], "not found"),
    (["--text", TEXT, "--device", "cuda"], "CUDA"),
    (["--text", TEXT, "--dtype", "bfloat16", "--device", "cpu"], "needs a GPU"),
    (["--text", TEXT, "--dtype", "float8"], "unknown dtype"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_one_line_exit_2(tmp_path, args, message):
    (tmp_path / "fake.png").write_text("not a picture")
    (tmp_path / "notmodel").mkdir()
    Image.new("RGB", (30, 30)).save(tmp_path / "good.png")
    args = [a.format(fake=tmp_path / "fake.png", notmodel=tmp_path / "notmodel", good=tmp_path / "good.png")
            for a in args]
    out = tmp_path / "out" / "x.npz"
    out.parent.mkdir()
    p = subprocess.run([sys.executable, "main.py", "export", *args, "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert list(out.parent.iterdir()) == []  # nothing half-written


def test_bad_output_path_and_debug_traceback(tmp_path, capsys):
    assert main(["export", "--text", TEXT, "--out", str(tmp_path / "x.txt")]) == 2
    assert main(["export", "--text", TEXT, "--out", str(tmp_path / "nodir" / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert ".npz" in err and "does not exist" in err
    p = subprocess.run([sys.executable, "main.py", "export", "--debug", "--text", "", "--out", str(tmp_path / "y.npz")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" in p.stderr


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    from attn_explorer.cli import export

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(export.np, "savez_compressed", boom)
    with pytest.raises(OSError):
        main(["export", "--text", TEXT, "--out", str(tmp_path / "x.npz")])
    assert list(tmp_path.iterdir()) == []


def test_module_and_console_entry_points(tmp_path):
    p = subprocess.run([sys.executable, "-m", "attn_explorer", "export", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "--dk-scale" in p.stdout
