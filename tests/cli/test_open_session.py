"""`--open run.npz` and `--session file.axsession` on the command line: rendered offscreen with
--screenshot, and every problem one line with exit status 2."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from attn_explorer.session.saved import SavedSession, file_sha256, write_session  # noqa: E402
from tests.cli.conftest import assert_one_error_line  # noqa: E402

TEXT = "the cat sat on the mat because it was tired"


def _picture(path, size):
    from PIL import Image

    img = Image.open(path).convert("RGB")
    assert img.size == size
    return np.asarray(img)


def _viridis_pixels(a: np.ndarray) -> int:
    """How many pixels are the deep purple of viridis' low end: a drawn map has many, an empty page none."""
    r, g, b = (a[..., i].astype(int) for i in range(3))
    return int(((r < 80) & (g < 80) & (b > 70) & (b > r)).sum())


def test_open_renders_the_saved_maps(tmp_path, cli):
    run = tmp_path / "run.npz"
    code, _, err = cli("export", "--model", "textbook", "--text", TEXT, "--out", run)
    assert code == 0, err
    out = tmp_path / "open.png"
    code, stdout, err = cli("--open", run, "--screenshot", out, "--size", "1024x700", "--view", "head")
    assert code == 0, err
    assert f"saved {out}" in stdout
    assert _viridis_pixels(_picture(out, (1024, 700))) > 20000  # the one head's map fills the page


def test_session_renders_offscreen(tmp_path, cli):
    s = SavedSession(model="textbook", device="cpu", text=TEXT, layer=1, head=2, page="head",
                     view={"colormap": "viridis"})
    path = write_session(s, tmp_path / "s.axsession")
    out = tmp_path / "session.png"
    code, stdout, err = cli("--session", path, "--screenshot", out, "--size", "1024x700")
    assert code == 0, err
    assert _viridis_pixels(_picture(out, (1024, 700))) > 20000


def test_a_changed_image_renders_but_exits_2_with_its_line(tmp_path, cli):
    from PIL import Image

    from tests.gui.conftest import sample

    img = tmp_path / "cat.png"
    Image.open(sample()).convert("RGB").save(img)
    s = SavedSession(model="textbook-vit", device="cpu", input_kind="image", image_path=str(img),
                     image_sha256=file_sha256(img), page="overlay")
    path = write_session(s, tmp_path / "img.axsession")
    Image.open(img).rotate(90).save(img)
    out = tmp_path / "img.png"
    code, _, err = cli("--session", path, "--screenshot", out, "--size", "1024x700")
    assert_one_error_line(code, err, "cat.png changed since the session was saved", str(out))
    assert out.is_file()


@pytest.mark.parametrize("problem", ["damaged", "newer", "missing model", "foreign run", "both"])
def test_each_problem_is_one_line_and_no_picture(tmp_path, cli, problem):
    good = write_session(SavedSession(model="textbook", text=TEXT), tmp_path / "good.axsession")
    d = json.loads(good.read_text(encoding="utf-8"))
    path = tmp_path / "s.axsession"
    args = ["--session", path]
    if problem == "damaged":
        path.write_text(good.read_text(encoding="utf-8")[:30], encoding="utf-8")
        words = ("s.axsession is damaged",)
    elif problem == "newer":
        path.write_text(json.dumps({**d, "version": 7}), encoding="utf-8")
        words = ("newer attn-explorer",)
    elif problem == "missing model":
        path.write_text(json.dumps({**d, "model": {"source": str(tmp_path / "gone")}}), encoding="utf-8")
        words = ("gone is missing",)
    elif problem == "foreign run":
        np.savez(tmp_path / "x.npz", weights=np.zeros(2))
        args, words = ["--open", tmp_path / "x.npz"], ("not a saved attn-explorer run",)
    else:
        args, words = ["--session", good, "--text", "hello"], ("without --text",)
    out = tmp_path / "out.png"
    code, _, err = cli(*args, "--screenshot", out)
    assert_one_error_line(code, err, *words)
    assert not out.exists()


def test_import_attn_explorer_does_not_import_qt_and_ax_open_does():
    import subprocess
    import sys

    code = ("import sys, attn_explorer as ax; qt = 'PySide6' in sys.modules; f = ax.open; "
            "print(qt, 'PySide6' in sys.modules, f.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "open_window"]
