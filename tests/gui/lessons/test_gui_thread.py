"""No lesson runs torch on the GUI thread: every page is shown, edited and its buttons pressed, with a
recorder of torch calls active on the GUI thread only.

The recorder is a `torch.overrides.TorchFunctionMode`: torch's mode stack is thread-local, so entered
on the GUI thread it sees every torch function and tensor method called there (a page's handler, a
lesson function called in place) and nothing the workers do. The two checks at the end prove both.
"""
from __future__ import annotations

import threading
import traceback

import numpy as np
import pytest
import torch
from PySide6.QtCore import Qt
from torch.overrides import TorchFunctionMode

from attn_explorer.lessons import coreference as co
from attn_explorer.session import lessons as L
from attn_explorer.session.lesson_list import LESSONS
from tests.gui.lessons.conftest import lanes_idle, stop_page


class TorchCalls(TorchFunctionMode):
    """Records every torch call made on the thread that entered it: (name, where it was called)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self.thread = threading.get_ident()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if threading.get_ident() == self.thread:  # the stack is per thread; this says so twice
            where = "".join(traceback.format_stack(limit=12)[:-1])
            self.calls.append((getattr(func, "__qualname__", None) or repr(func), where))
        return func(*args, **(kwargs or {}))

    def report(self) -> str:
        return "\n".join(f"{name} called on the GUI thread from:\n{where}" for name, where in self.calls[:3])


def _settle(qtbot, window, page, timeout=60000):
    qtbot.waitUntil(lambda: lanes_idle(page) and not window.state.busy, timeout=timeout)


def _by_hand(p, qtbot, window, tmp_path):
    p.keys.set_cell(0, 0, "3")
    p.add_btn.click()
    p.d_k.setValue(3)
    p.temperature.setValue(2.0)
    p.query.set_cell(0, 0, "abc")
    _settle(qtbot, window, p)
    assert "not a number" in p.message.text()
    p.query.set_cell(0, 0, "1")
    p.show_code.setChecked(True)
    _settle(qtbot, window, p)
    assert p.message.text() == "" and p.steps.d_k == 3 and p.step_table.rowCount() == 5


def _inside_a_head(p, qtbot, window, tmp_path):
    qtbot.waitUntil(lambda: p.trace is not None and p.body.isEnabled(), timeout=30000)
    p.layer_spin.setValue(1)
    p.head_spin.setValue(2)
    p.query_combo.setCurrentIndex(3)
    _settle(qtbot, window, p)
    qtbot.waitUntil(lambda: p.body.isEnabled(), timeout=30000)
    assert (p.trace.layer, p.trace.head, p.trace.query) == (1, 2, 3)
    p.table.setCurrentCell(1, 0)


def _projections(p, qtbot, window, tmp_path):
    p.x_table.set_cell(0, 0, "2")
    p.reroll.click()
    p.words.setText("dogs bark at night")
    p.words.editingFinished.emit()
    _settle(qtbot, window, p)
    assert p.tokens() == ["dogs", "bark", "at", "night"] and p.result.pattern.shape == (4, 4)


def _multi_head(p, qtbot, window, tmp_path):
    p.heads.setCurrentIndex(2)
    p.reroll.click()
    p.x_table.set_cell(1, 1, "0.5")
    _settle(qtbot, window, p)
    assert p.result.num_heads == 4 and len(p.pattern_tables) == 4


def _order(p, qtbot, window, tmp_path):
    qtbot.mouseClick(p.shuffle_btn, Qt.LeftButton)
    p.text.setText("dogs chase cats")
    p.text.editingFinished.emit()
    p.positions.setValue(20)
    p.dims.setValue(16)
    _settle(qtbot, window, p)
    assert p.check.words == ["dogs", "chase", "cats"] and p.table_img.image.shape == (20, 16)


def _scaling(p, qtbot, window, tmp_path):
    p.keys.setValue(64)
    p.seed.setValue(3)
    _settle(qtbot, window, p)
    assert p.curves.num_keys == 64 and p.curves.seed == 3


def _block(p, qtbot, window, tmp_path):
    qtbot.waitUntil(lambda: p.stream is not None, timeout=60000)
    window.state.set_text("a short one")
    qtbot.waitUntil(lambda: p.stream is not None and p.stream.num_tokens == 5, timeout=60000)  # [CLS] … [SEP]
    _settle(qtbot, window, p)
    assert p.trace.words == ["a", "short", "one"]


def _coreference(p, qtbot, window, tmp_path):
    qtbot.mouseClick(p.primer_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: "animal" in window.state.result.tokens and p.find_btn.isEnabled(), timeout=60000)
    qtbot.mouseClick(p.find_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: p.ranking is not None, timeout=60000)
    p.table.cellDoubleClicked.emit(1, 0)
    p.rival.setCurrentIndex(0)
    _settle(qtbot, window, p)


def _train_vit(p, qtbot, window, tmp_path):
    p.epochs.setValue(1)
    p.start_button.click()
    qtbot.waitUntil(lambda: p.record_count > 3, timeout=60000)
    p.pause_button.click()
    qtbot.waitUntil(lambda: p.pause_button.text() == "Resume", timeout=30000)
    path = tmp_path / "tiny.safetensors"
    p.save_to(str(path))
    qtbot.waitUntil(lambda: "Saved" in p.status.text(), timeout=30000)
    p.pause_button.click()
    qtbot.waitUntil(lambda: not p.running, timeout=120000)
    p.strip.block.setCurrentIndex(1)
    p.load_from(str(path))
    qtbot.waitUntil(lambda: "Loaded" in p.status.text(), timeout=30000)
    _settle(qtbot, window, p)


def _no_softmax(p, qtbot, window, tmp_path):
    p.decay.setValue(0.5)
    p.fixed_beta.setChecked(True)
    p.seed.setValue(2)
    _settle(qtbot, window, p)
    assert p.result is not None and p.result.seed == 2 and p.result.decay == 0.5


EXERCISES = {"by-hand": _by_hand, "inside-a-head": _inside_a_head, "projections": _projections,
             "multi-head": _multi_head, "order": _order, "scaling": _scaling, "block": _block,
             "coreference": _coreference, "train-vit": _train_vit, "no-softmax": _no_softmax}


def test_every_lesson_is_exercised_here():
    assert set(EXERCISES) == set(LESSONS)


def test_no_lesson_runs_torch_on_the_gui_thread(make_window, qtbot, tmp_path):
    window = make_window(model="minilm", text=co.PRIMER_SENTENCE)
    lessons = window.pages["lessons"]
    recorder = TorchCalls()
    with recorder:
        window.show_page("lessons")
        for name in LESSONS:
            page = lessons.show_lesson(name)
            assert page.objectName() == f"lesson-{name}" and hasattr(page, "lanes"), page  # it built
            _settle(qtbot, window, page)
            EXERCISES[name](page, qtbot, window, tmp_path)
            _settle(qtbot, window, page)
            stop_page(page, qtbot)
            assert not recorder.calls, f"lesson {name!r}: " + recorder.report()
    assert not recorder.calls, recorder.report()


def test_the_recorder_sees_a_planted_gui_thread_call_and_no_worker_call(qtbot, monkeypatch):
    """The check above can fail: a torch call planted in a page's GUI-thread handler is recorded; the
    same lesson computing in its worker is not."""
    from attn_explorer.gui.lessons.by_hand import ByHandLesson
    from attn_explorer.session.state import SessionState

    planted = ByHandLesson._computed

    def computed_with_torch(self, answer):
        torch.as_tensor(np.asarray(answer[0].weights)).sum()  # a tiny tensor, on the GUI thread
        planted(self, answer)

    recorder = TorchCalls()
    state = SessionState(device="cpu")
    with recorder:
        page = ByHandLesson(state)  # its first numbers come from L.hand_steps, in a worker
        qtbot.addWidget(page)
        qtbot.waitUntil(lambda: page.steps is not None, timeout=30000)
        assert recorder.calls == []  # the worker's torch is not the GUI thread's
        monkeypatch.setattr(ByHandLesson, "_computed", computed_with_torch)
        page.keys.set_cell(0, 0, "5")
        qtbot.waitUntil(lambda: lanes_idle(page), timeout=30000)
    state.shutdown()
    names = [name for name, _ in recorder.calls]
    assert any("as_tensor" in n for n in names) and any("sum" in n for n in names), names
    assert "computed_with_torch" in recorder.calls[0][1]


@pytest.mark.parametrize("fn", [L.hand_steps])
def test_a_lesson_job_called_in_place_is_recorded(fn):
    with TorchCalls() as recorder:
        fn([["2", "0"]], [["2", "0"], ["0", "3"]], [["1", "0"], ["0", "1"]], 1.0)
    assert recorder.calls  # calling a lesson directly on the GUI thread would be caught
