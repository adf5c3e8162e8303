"""`launch`, the one way a long job runs: results, streams, one-line errors, cancellation, progress, no leaks.

Only qtbot's event loop is used; no window."""
from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

from attn_explorer.errors import UserError
from attn_explorer.session.workers import error_message, launch, live_workers


def test_error_message_is_one_line():
    assert error_message(UserError("cannot read image foo.png")) == "cannot read image foo.png"
    assert error_message(MemoryError()) == "MemoryError"
    assert error_message(RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB")) == \
        "RuntimeError: CUDA out of memory."


def _launch(qtbot, fn, *args, **kw):
    """Run fn through launch and wait for it to finish; returns what each handler got, in order."""
    got: list[tuple] = []
    done = threading.Event()
    worker = launch(fn, *args, on_result=lambda r: got.append(("result", r)),
                    on_yield=lambda v: got.append(("yield", v)), on_error=lambda m: got.append(("error", m)),
                    on_progress=lambda f, m: got.append(("progress", f, m)),
                    on_finished=lambda: (got.append(("finished",)), done.set()), **kw)
    qtbot.waitUntil(done.is_set, timeout=10000)
    return worker, got


def test_result_arrives_in_the_gui_thread_from_another(qtbot):
    main = threading.get_ident()
    seen = []

    def job(x):
        return x * 2, threading.get_ident()

    _, got = _launch(qtbot, job, 21)
    (kind, (value, thread)), finished = got
    assert kind == "result" and value == 42 and thread != main and finished == ("finished",)
    launch(lambda: 1, on_result=lambda r: seen.append(threading.get_ident()))
    qtbot.waitUntil(lambda: bool(seen), timeout=10000)
    assert seen == [main]  # the handler runs in the thread that launched the job


def test_progress_is_reported_before_the_result(qtbot):
    def job(progress):
        progress(0.25, "a quarter")
        progress(1.0, "all")
        return "ok"

    _, got = _launch(qtbot, job)
    assert got == [("progress", 0.25, "a quarter"), ("progress", 1.0, "all"), ("result", "ok"), ("finished",)]


def test_a_generator_streams_every_yield_then_its_return_value(qtbot):
    def stream(n):
        for i in range(n):
            yield i * i
        return "done"

    _, got = _launch(qtbot, stream, 5)
    assert got == [("yield", 0), ("yield", 1), ("yield", 4), ("yield", 9), ("yield", 16), ("result", "done"),
                   ("finished",)]


@pytest.mark.parametrize("exc, text", [(UserError("empty text"), "empty text"),
                                       (ValueError("bad value\n  at line 3"), "ValueError: bad value"),
                                       (MemoryError(), "MemoryError")])
def test_errors_become_one_line(qtbot, exc, text, capsys):
    def job():
        raise exc

    _, got = _launch(qtbot, job)
    assert got == [("error", text), ("finished",)]


def test_an_error_in_a_generator_stops_the_stream_with_one_line(qtbot):
    def stream():
        yield 1
        raise UserError("the sweep ran out of input")

    _, got = _launch(qtbot, stream)
    assert got == [("yield", 1), ("error", "the sweep ran out of input"), ("finished",)]


def test_no_result_after_quit_even_if_the_job_returns(qtbot):
    gate = threading.Event()
    running = threading.Event()

    def job():
        running.set()
        gate.wait(5)
        return "late"

    got: list = []
    done = threading.Event()
    w = launch(job, on_result=got.append, on_error=got.append, on_finished=done.set)
    assert running.wait(5)
    w.quit()
    gate.set()
    qtbot.waitUntil(done.is_set, timeout=10000)
    assert got == []


def test_quit_while_a_result_is_queued_drops_it(qtbot):
    """The job returned in its thread before quit(); its result waits in the GUI thread's queue."""
    got: list = []
    gate, returned = threading.Event(), threading.Event()
    w = launch(gate.wait, 5, on_result=got.append)
    w.returned.connect(lambda _: returned.set(), Qt.DirectConnection)  # set in the worker thread as it emits
    gate.set()
    assert returned.wait(5)
    w.quit()
    qtbot.waitUntil(lambda: live_workers() == 0, timeout=5000)  # its queued handlers ran before it left the registry
    assert got == []


def test_quit_stops_a_generator_and_a_progress_job(qtbot):
    more = threading.Event()

    def stream():
        i = 0
        while True:
            yield i
            i += 1
            more.wait(0.01)

    def slow(progress):
        for i in range(1000):
            progress(i / 1000, "")
            more.wait(0.01)
        return "all"

    for fn in (stream, slow):
        got: list = []
        done = threading.Event()
        progressed = threading.Event()
        w = launch(fn, on_yield=got.append, on_result=got.append, on_finished=done.set,
                   on_progress=lambda *_: progressed.set())
        qtbot.waitUntil(lambda: bool(got) or progressed.is_set(), timeout=5000)  # it is under way
        w.quit()
        qtbot.waitUntil(done.is_set, timeout=5000)
        n = len(got)
        qtbot.waitUntil(lambda: live_workers() == 0, timeout=5000)  # every queued value has arrived
        assert "all" not in got and len(got) == n  # nothing after the stop


def test_the_registry_empties(qtbot):
    gate = threading.Event()
    workers = [launch(gate.wait, 5) for _ in range(3)]
    assert live_workers() >= 3
    gate.set()
    qtbot.waitUntil(lambda: live_workers() == 0, timeout=10000)
    assert all(not w.is_running for w in workers)


def test_superqt_is_used_through_its_public_api_only():
    """Private superqt names (WorkerBase._worker_set, _finished, _set_discard, utils._qthreading) change
    without notice between releases; the registry of live workers is ours."""
    import ast
    import inspect

    from attn_explorer.session import workers

    tree = ast.parse(inspect.getsource(workers))
    private = [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
               and node.attr.startswith("_") and not node.attr.startswith("__")
               and isinstance(node.value, ast.Name) and node.value.id in ("WorkerBase", "GeneratorWorker",
                                                                           "FunctionWorker", "superqt")]
    modules = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module and node.module.startswith("superqt") and "._" in node.module]
    assert private == [] and modules == []

