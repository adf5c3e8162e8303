"""The shared worker pattern: results, one-line errors, cancellation, no leaked workers."""
from __future__ import annotations

import threading

import pytest

from attn_explorer.errors import UserError
from attn_explorer.session.workers import Worker, error_message, live_workers


def test_error_message_is_one_line():
    assert error_message(UserError("cannot read image foo.png")) == "cannot read image foo.png"
    assert error_message(MemoryError()) == "MemoryError"
    assert error_message(RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB")) == \
        "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"


def _run(qtbot, w: Worker):
    got = {}
    w.signals.result.connect(lambda r: got.setdefault("result", r))
    w.signals.error.connect(lambda e: got.setdefault("error", e))
    w.signals.progress.connect(lambda f, m: got.setdefault("progress", (f, m)))
    with qtbot.waitSignal(w.signals.finished, timeout=10000):
        w.start()
    return got


def test_result_progress_and_thread(qtbot):
    main = threading.get_ident()

    def job(x, progress):
        progress(0.5, "half")
        return x * 2, threading.get_ident()

    got = _run(qtbot, Worker(job, 21))
    assert got["result"][0] == 42 and got["result"][1] != main
    assert got["progress"] == (0.5, "half")
    qtbot.waitUntil(lambda: live_workers() == 0)


@pytest.mark.parametrize("exc, text", [(UserError("empty text"), "empty text"),
                                       (ValueError("bad\nvalue"), "ValueError: bad value")])
def test_errors_become_messages(qtbot, exc, text):
    def job():
        raise exc

    got = _run(qtbot, Worker(job))
    assert got == {"error": text}


def test_cancelled_job_emits_no_result(qtbot):
    gate = threading.Event()

    def job(worker):
        gate.wait(5)
        return "late"

    w = Worker(job)
    got = {}
    w.signals.result.connect(lambda r: got.setdefault("result", r))
    with qtbot.waitSignal(w.signals.finished, timeout=10000):
        w.start()
        w.cancel()
        gate.set()
    assert got == {}
