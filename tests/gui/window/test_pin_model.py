"""Issue 24 D: "Pin model" in the model picker's right-click menu (and the File menu) keeps the model in memory
across switches; the choice is saved and comes back with the model in the next window."""
from __future__ import annotations

import argparse

import pytest

pytest.importorskip("transformers")

from tests.gui.conftest import cached_loader  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("llama") / "llama"))


def _window(qtbot, settings, folder):
    from attn_explorer.gui.window.app import build_window, get_qapp

    get_qapp()
    args = argparse.Namespace(model=folder, text="The capital of France is Paris.", image=None, device="cpu",
                              view="grid", screenshot=None)
    window, state = build_window(args, settings=settings, loader=cached_loader)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: state.info is not None and not state.busy, timeout=60000)
    return window, state


def test_pin_model_is_in_the_pickers_menu_and_is_saved(qtbot, settings, folder):
    window, state = _window(qtbot, settings, folder)
    try:
        act = window.pin.action
        assert act in window.model_combo.actions() and act.isEnabled() and not act.isChecked()
        assert act in [a for m in window.menuBar().findChildren(type(window.menuBar().actions()[0].menu()))
                       for a in m.actions()]
        act.trigger()
        assert state.pinned and act.isChecked()
        assert settings.value("model/pinned") in ([folder], folder)
    finally:
        state.shutdown()
    window2, state2 = _window(qtbot, settings, folder)  # the next window: the same model comes back pinned
    try:
        assert state2.pinned and window2.pin.action.isChecked()
        window2.pin.action.trigger()
        assert not state2.pinned and settings.value("model/pinned", []) in ([], None, "")
    finally:
        state2.shutdown()
