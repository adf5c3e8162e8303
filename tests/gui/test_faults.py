"""Faults in the window: a model run that raises (any exception, or torch's out-of-memory), closing the
window mid-run, and every bad input of the corpus (tests/corpus/cases.py) fed to the window.

For each: the banner shows one line, the previous result stays on screen (the same RunResult), and
the window still answers the next edit with a new result.
"""
from __future__ import annotations

import argparse
import threading
import time

import pytest
import torch
from PySide6.QtCore import QSettings

from attn_explorer.session.workers import live_workers
from tests.corpus.cases import BAD, Case
from tests.corpus.make_cases import build_all
from tests.gui.conftest import cached_loader, cached_model


def banner_line(w) -> str:
    text = w.banner.text
    assert w.banner.isVisible() and text.startswith("⚠ "), text
    assert "\n" not in text and "Traceback" not in text, text
    return text[2:]


def type_text(w, qtbot, text: str):
    """Type into the box (the debounced live run) and wait for the result of exactly that text."""
    before = w.state.result
    w.input_panel.text.setPlainText(text)
    qtbot.waitUntil(lambda: w.state.result is not None and w.state.result is not before
                    and w.state.result.tokens[:1] == text.split()[:1], timeout=30000)
    return w.state.result


# ---- a run that raises ---------------------------------------------------------------------------------

def _oom() -> BaseException:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 8.00 GiB total)\n"
                                  "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF")


@pytest.mark.parametrize("fault, shown", [
    (lambda: RuntimeError("boom\nsecond line of a long torch message"), "RuntimeError: boom"),
    (_oom, "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 8.00 GiB total)"),
    (lambda: MemoryError(), "MemoryError"),
], ids=["exception", "torch-oom", "memoryerror"])
def test_a_failing_run_keeps_the_view_and_the_window_answers(make_window, qtbot, monkeypatch, fault, shown, capsys):
    w = make_window(model="textbook", text="one two three")
    model = cached_model("textbook")  # the object the session runs
    first = w.state.result
    painted = w.grid.last_image

    def failing(*a, **k):
        raise fault()

    monkeypatch.setattr(model, "run", failing)
    w.input_panel.text.setPlainText("four five six seven")
    qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=30000)
    assert banner_line(w) == shown
    assert w.state.result is first and w.grid.last_image is painted  # the last good view stays
    # the job's error and its end arrive as two queued events: busy clears with the second
    qtbot.waitUntil(lambda: not w.state.busy, timeout=5000)
    assert w.state.result is first
    monkeypatch.undo()  # the model works again: the next edit is answered
    r = type_text(w, qtbot, "eight nine ten eleven twelve")
    assert r.tokens == ["eight", "nine", "ten", "eleven", "twelve"]
    capsys.readouterr()  # the worker printed the unexpected exception's traceback to stderr, for developers


def test_closing_the_window_mid_run_returns_promptly_and_leaves_no_worker(make_window, qtbot, monkeypatch):
    w = make_window(model="textbook", text="one two three")
    model = cached_model("textbook")
    real = model.run
    started, release = threading.Event(), threading.Event()
    delivered = []

    def slow(*a, **k):
        started.set()
        release.wait(3.0)  # a long forward pass (a big input, a slow machine)
        return real(*a, **k)

    monkeypatch.setattr(model, "run", slow)
    w.state.attention_ready.connect(delivered.append)
    w.input_panel.text.setPlainText("a slow run of several words")
    qtbot.waitUntil(started.is_set, timeout=10000)
    t0 = time.perf_counter()
    w.close()
    closed_in = time.perf_counter() - t0
    release.set()
    # a worker leaves the registry after its queued handlers ran: anything it sent has arrived by now
    qtbot.waitUntil(lambda: live_workers() == 0, timeout=10000)
    assert closed_in < 1.0, f"close() blocked {closed_in:.1f} s on the running job"
    assert delivered == []  # the result of a job stopped by the close never reaches the views


# ---- the corpus, through the window -------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    return build_all(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def windows(qapp, tmp_path_factory):
    """One text window (textbook) and one image window (textbook-vit) for the whole module: every case
    leaves them as it found them, and the next case checks that."""
    from attn_explorer.gui.window.app import build_window

    made = {}
    for kind, model in (("text", "textbook"), ("image", "textbook-vit")):
        settings = QSettings(str(tmp_path_factory.mktemp("s") / "settings.ini"), QSettings.IniFormat)
        args = argparse.Namespace(model=model, text=None, image=None, device="cpu", view=None, screenshot=None)
        window, state = build_window(args, settings=settings, loader=cached_loader)
        window.resize(1200, 800)
        window.show()
        made[kind] = window
    yield made
    for window in (made["text"], made["image"]):
        window.state.shutdown()
        window.close()
        window.deleteLater()


GUI_CASES = [c for c in BAD if c.gui is not None]


def _fill(value: str, corpus: dict) -> str:
    return value.format(**{k: str(v) for k, v in corpus.items()})


@pytest.mark.parametrize("case", GUI_CASES, ids=[c.id for c in GUI_CASES])
def test_bad_input_in_the_window(case: Case, corpus, windows, qtbot):
    kind, arg = case.gui[0], _fill(case.gui[1], corpus)
    w = windows["image" if kind == "image" else "text"]
    qtbot.waitUntil(lambda: w.state.result is not None and not w.state.busy, timeout=60000)
    w.banner.hide()
    first, info = w.state.result, w.state.info
    if kind == "load":
        w.open_model_folder(arg)
    elif kind == "image":
        w.open_image(arg)
    elif kind == "textfile":
        w.open_text_file(arg)
    elif kind == "type":
        w.input_panel.text.setPlainText(arg)
    elif kind == "type-quiet":
        with qtbot.waitSignal(w.state.input_cleared, timeout=10000):  # the debounced box sends it
            w.input_panel.text.setPlainText(arg)
    else:
        with pytest.raises(Exception):  # noqa: B017 - export shows the banner, then re-raises for its caller
            w.export(arg)
    if kind == "type-quiet":  # an empty box: nothing to run, nothing to complain about; the pages say so
        qtbot.waitUntil(lambda: not w.state.busy, timeout=30000)
        assert not w.banner.isVisible()
        assert w.state.result is None and w.state.info is info
        assert "type or paste some text" in w.grid.placeholder.text() and w.grid.stack.currentWidget() is w.grid.placeholder
    else:
        qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=30000)
        line = banner_line(w)
        assert (case.gui_expect or case.expect).replace("_", "-") in line.replace("_", "-"), line
    qtbot.waitUntil(lambda: not w.state.busy, timeout=30000)
    if kind != "type-quiet":
        assert w.state.result is first and w.state.info is info  # the previous model and view stay
    # and the window still answers
    if kind == "image":  # a picture other than the one on screen (the same one would only be redrawn)
        good = next(str(corpus[n]) for n in ("good_jpg", "cmyk_jpg") if str(corpus[n]) != windows.get("shown"))
        windows["shown"] = good
        w.open_image(good)
        qtbot.waitUntil(lambda: w.state.result is not first, timeout=30000)
        assert w.state.result.grid == (14, 14) and w.state.image == good
    else:
        words = f"{case.id.replace('_', ' ').replace('=', ' ')} works again"
        r = type_text(w, qtbot, words)
        assert r.tokens == words.split()
