"""Open session brings back the session's text in the text box on the paths where the model changes (the
open defect "a saved .axsession whose text was 'When Mary and John…' opened with 'The animal didn't
cross…' in the box"; not reproduced on these paths, kept as their guard)."""
from __future__ import annotations

import argparse

import pytest

from attn_explorer.gui.window.app import build_window, get_qapp
from tests.gui.conftest import cached_loader, sample
from tests.tiny_llama import make_llama_folder

MARY = "When Mary and John went to the store, John gave a drink to"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("tiny") / "llama", seed=3)


def _window(qtbot, settings, wait=True, **kw):
    get_qapp()
    args = argparse.Namespace(**{"model": None, "text": None, "image": None, "device": "cpu", "view": None,
                                 "screenshot": None, "session": None, "open": None, **kw})
    w, st = build_window(args, settings=settings, loader=cached_loader)
    qtbot.addWidget(w)
    w.resize(1300, 850)
    w.show()
    if wait:
        qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=60000)
    return w, st


def _shows_mary(qtbot, w, st, model: str) -> None:
    qtbot.waitUntil(lambda: not st.busy and st.result is not None and st.info.name == model, timeout=60000)
    assert st.text == MARY and w.input_panel.text.toPlainText() == MARY
    assert st.result.total_tokens > 5  # the session's text ran, not the sample sentence


def test_a_session_on_another_model_brings_its_text_back_into_the_box(qtbot, settings, tmp_path, tiny_folder):
    w, st = _window(qtbot, settings, model=str(tiny_folder), text=MARY)
    path = w.save_session(str(tmp_path / "tiny.axsession"))
    st.shutdown()
    # opened while the start-up model (minilm, with the sample sentence in the box) still loads
    w, st = _window(qtbot, settings, model="minilm", wait=False)
    assert st.runner.loading and w.input_panel.text.toPlainText() == st.text != MARY
    assert w.open_session(str(path))
    _shows_mary(qtbot, w, st, str(tiny_folder))
    # opened while an image model is loaded, twice in a row
    w.open_image(sample())
    qtbot.waitUntil(lambda: not st.busy and st.info.modality == "image" and st.result is not None, timeout=60000)
    assert w.open_session(str(path)) and w.open_session(str(path))
    _shows_mary(qtbot, w, st, str(tiny_folder))
    # opened while a saved run of another text is shown
    st.set_text("The animal didn't cross the street because it was too tired.")
    qtbot.waitUntil(lambda: not st.busy and st.result is not None and st.result.total_tokens > 0, timeout=60000)
    run = w.export(str(tmp_path / "run.npz"))
    assert w.open_saved_run(str(run))
    qtbot.waitUntil(lambda: bool(st.result_only) and st.result is not None, timeout=60000)
    assert w.input_panel.text.toPlainText() != MARY
    assert w.open_session(str(path))
    _shows_mary(qtbot, w, st, str(tiny_folder))
    st.shutdown()
