"""`python main.py --screenshot OUT.png --view V` renders every page offscreen and exits 0."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.gui.conftest import sample

ROOT = Path(__file__).resolve().parents[2]

CASES = {
    "grid": ["--model", "textbook", "--text", "The animal didn't cross the street because it was too tired."],
    "head": ["--model", "textbook"],
    "tokens": ["--model", "textbook"],
    "overlay": ["--model", "textbook-vit", "--image", sample("coffee")],
}


def _heatmap_like(png: Path) -> None:
    img = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    assert img.shape[0] > 400 and img.shape[1] > 600
    assert img.std() > 20  # not one flat colour
    colours = np.unique(img.reshape(-1, 3)[::7], axis=0)
    assert len(colours) > 200  # a heatmap or photo has many distinct colours; an empty window does not


@pytest.mark.parametrize("view", list(CASES))
def test_screenshot_writes_non_blank_png(view, tmp_path):
    out = tmp_path / f"{view}.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "cfg"), HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--screenshot", str(out), "--view", view,
                           "--device", "cpu", *CASES[view]],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.is_file()
    _heatmap_like(out)


def test_unknown_view_is_a_one_line_error(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "cfg"), HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--screenshot", str(tmp_path / "x.png"),
                           "--view", "nope", "--model", "textbook"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown view 'nope'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_size_option_is_checked():
    from attn_explorer.errors import UserError
    from attn_explorer.gui.window.app import window_size

    assert window_size("1024x700") == (1024, 700) and window_size("1920×1080") == (1920, 1080)
    assert window_size(None) is None
    for bad in ("1024", "wide", "10x10", "1024x-700"):
        with pytest.raises(UserError, match="WIDTHxHEIGHT"):
            window_size(bad)


def test_screenshot_at_a_chosen_size(tmp_path):
    out = tmp_path / "small.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "cfg"), HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--screenshot", str(out), "--view", "head",
                           "--size", "1024x700", "--device", "cpu", "--model", "textbook"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert Image.open(out).size == (1024, 700)  # the window fits a small screen: nothing forces it taller


@pytest.mark.parametrize("text", ["", "   \n "])
def test_empty_text_renders_the_empty_state_and_exits(text, tmp_path):
    """Empty text never starts a run: the screenshot must not wait for one (it waited 300 s)."""
    out = tmp_path / "empty.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "cfg"), HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--screenshot", str(out), "--device", "cpu",
                           "--model", "textbook", "--text", text],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.is_file() and "nothing to run" in proc.stdout
