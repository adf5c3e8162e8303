"""Weights loaded from a folder are labelled by where they came from, never "trained": a folder may hold random
weights, and nothing in it says so. The built-ins say what they are."""
from __future__ import annotations

import argparse

import pytest

import attn_explorer as ax
from attn_explorer.gui.window.app import build_window, get_qapp
from attn_explorer.session.jobs import default_loader
from tests.tiny_llama import make_llama_folder


@pytest.fixture(scope="module")
def random_folder(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("w") / "random-llama", seed=5)


def test_the_api_says_where_folder_weights_came_from(random_folder):
    info = ax.load_model(str(random_folder), device="cpu").info
    assert info.weights == "from random-llama"
    assert ax.load_model("minilm").info.weights == "trained"
    assert ax.load_model("textbook").info.weights == "untrained"


def test_the_model_picker_never_calls_a_folder_trained(qtbot, settings, random_folder):
    get_qapp()
    args = argparse.Namespace(model=str(random_folder), text="the cat sat", image=None, device="cpu", view=None,
                              screenshot=None, session=None, open=None)
    window, state = build_window(args, settings=settings, loader=default_loader)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: state.result is not None and not state.busy, timeout=60000)
    shown = window.model_combo.currentText()
    assert "from random-llama" in shown and "trained" not in shown, shown
    state.shutdown()
