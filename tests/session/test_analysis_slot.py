"""AnalysisSlot: one analysis job in flight per page, the newest waiting, older answers dropped."""
from __future__ import annotations

import threading

from attn_explorer.session.analysis import AnalysisSlot, calc


def test_only_the_newest_answer_arrives_and_jobs_never_pile_up(qtbot):
    gate = threading.Event()
    ran, got, errors = [], [], []

    def job(x):
        if x == 0:
            gate.wait(10)  # the first job is slow: the others arrive while it runs
        ran.append(x)
        return x

    slot = AnalysisSlot(errors.append)
    for x in range(5):
        assert slot.start(job, x, on_result=got.append)
    assert slot.launched == 1 and slot.busy  # 1..3 were replaced by 4 while waiting
    gate.set()
    qtbot.waitUntil(lambda: got == [4] and not slot.busy, timeout=10000)
    assert ran == [0, 4] and slot.launched == 2 and errors == []


def test_errors_of_the_newest_job_are_one_line_and_the_slot_goes_on(qtbot):
    errors, got = [], []
    slot = AnalysisSlot(errors.append)
    slot.start(calc("rollout").attention_rollout, [[1.0]], on_result=got.append)
    qtbot.waitUntil(lambda: bool(errors) and not slot.busy, timeout=10000)
    assert errors[0].startswith("rollout needs attention shaped") and got == []
    slot.start(sum, [1, 2], on_result=got.append)
    qtbot.waitUntil(lambda: got == [3], timeout=10000)


def test_without_a_model_nothing_starts(qtbot):
    from attn_explorer.session.state import SessionState

    st = SessionState()
    slot = AnalysisSlot(lambda m: None)
    assert slot.start(lambda model: 1, on_result=print, state=st) is False and slot.launched == 0
    st.shutdown()
