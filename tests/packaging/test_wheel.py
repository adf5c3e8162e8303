"""A plain `pip install .` must carry resources/: build the wheel and look inside."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_carries_icon_and_samples(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("attn_explorer-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "attn_explorer/_resources/icon.png" in names
    samples = {n for n in names if n.startswith("attn_explorer/_resources/samples/") and n.endswith(".jpg")}
    assert {Path(n).name for n in samples} >= {"chelsea-cat.jpg", "coffee.jpg", "astronaut.jpg"}
    assert "attn_explorer/resources.py" in names and "attn_explorer/cli/main.py" in names
    # the HTML page's viewer (api/html.py inlines it)
    assert {"attn_explorer/_resources/html/viewer.js", "attn_explorer/_resources/html/viewer.css"} <= names


def test_resource_path_prefers_the_installed_copy(tmp_path, monkeypatch):
    from attn_explorer import resources

    pkg = tmp_path / "attn_explorer"
    (pkg / "_resources" / "samples").mkdir(parents=True)
    (pkg / "_resources" / "icon.png").write_bytes(b"png")
    monkeypatch.setattr(resources, "_PACKAGE", pkg)
    assert resources.resource_path("samples") == pkg / "_resources" / "samples"


def test_resource_path_frozen(tmp_path, monkeypatch):
    from attn_explorer import resources

    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "icon.png").write_bytes(b"png")
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert resources.resource_path("icon.png") == tmp_path / "resources" / "icon.png"


def test_resource_path_in_this_checkout():
    from attn_explorer.resources import resource_path

    assert resource_path("samples", "chelsea-cat.jpg").is_file()
