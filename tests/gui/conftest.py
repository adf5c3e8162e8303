"""GUI fixtures: temporary QSettings, models loaded once per session, and a ready window."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings  # noqa: E402

from attn_explorer.session.state import Loaded  # noqa: E402

_MODELS: dict[str, object] = {}


def cached_model(name: str):
    """Load a built-in model once for the whole session."""
    if name not in _MODELS:
        import attn_explorer as ax

        _MODELS[name] = ax.load_model(name, device="cpu")
    return _MODELS[name]


def cached_loader(src, device="cpu", progress=None, want_image=False):
    """Drop-in for state.default_loader that reuses session models (and still fails on bad input)."""
    import attn_explorer as ax

    if not src:
        src = "textbook-vit" if want_image else "textbook"
    if src in ("minilm", "textbook", "textbook-vit", "textbook-nopos", "dinov2-small"):
        m = cached_model(src)
    else:
        m = ax.load_model(src, device="cpu", progress=progress)
    return Loaded(model=m, info=m.info, builtins=list(ax.builtin_models()))


@pytest.fixture(autouse=True)
def _isolated_settings(tmp_path, monkeypatch):
    """No GUI test may read or write the user's real settings."""
    QSettings.setDefaultFormat(QSettings.IniFormat)
    QSettings.setPath(QSettings.IniFormat, QSettings.UserScope, str(tmp_path / "qsettings"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def settings(tmp_path) -> QSettings:
    return QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)


@pytest.fixture
def make_window(qtbot, settings):
    """make_window(model=, text=, image=, view=) -> a shown MainWindow with its first result on screen."""
    from attn_explorer.gui.window.app import build_window, get_qapp

    get_qapp()
    made = []

    def make(model="textbook", text=None, image=None, view=None, wait=True):
        args = argparse.Namespace(model=model, text=text, image=image, device="cpu", view=view, screenshot=None)
        window, state = build_window(args, settings=settings, loader=cached_loader)
        qtbot.addWidget(window)
        window.resize(1300, 850)
        window.show()
        made.append(window)
        if wait:
            qtbot.waitUntil(lambda: state.result is not None, timeout=60000)
        return window

    yield make
    for w in made:
        w.state.shutdown()


def sample(name: str = "chelsea-cat") -> str:
    from attn_explorer.resources import resource_path

    return str(resource_path("samples", f"{name}.jpg"))


@pytest.fixture
def sample_path() -> str:
    p = sample()
    assert Path(p).is_file()
    return p


@pytest.fixture
def dtype_window(qtbot, settings):
    """dtype_window(dtype, loader=default_loader) -> (window, state): the textbook model on a short text,
    loaded in `dtype` as the command line's --dtype asks, with its first result on screen."""
    from attn_explorer.gui.window.app import build_window, get_qapp
    from attn_explorer.session.jobs import default_loader

    def make(dtype="float32", loader=default_loader):
        get_qapp()
        args = argparse.Namespace(model="textbook", text="the cat sat on the mat", image=None, device="cpu",
                                  view=None, screenshot=None, dtype=dtype)
        w, state = build_window(args, settings=settings, loader=loader)
        qtbot.addWidget(w)
        w.show()
        qtbot.waitUntil(lambda: state.result is not None and not state.busy, timeout=60000)
        return w, state

    return make
