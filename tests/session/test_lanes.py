"""Side-job lanes (state.submit(..., key=...)), as the analysis pages use them: the newest job of a lane
wins, jobs never pile up, an error is one line and the lane goes on, and without a model nothing starts.
(What AnalysisSlot did for each page, now the runner's.)"""
from __future__ import annotations

import threading

from attn_explorer.session.analysis import rollout_job
from attn_explorer.session.runner import Task
from attn_explorer.session.state import SessionState


def test_only_the_newest_answer_arrives_and_jobs_never_pile_up(qtbot):
    st = SessionState()
    gate = threading.Event()
    ran, got, errors = [], [], []

    def job(x):
        if x == 0:
            gate.wait(10)  # the first job is slow: the others arrive while it runs
        ran.append(x)
        return x

    for x in range(5):
        assert st.submit(job, x, key="analysis-test", on_result=got.append, on_error=errors.append, uses_model=False)
    assert st.job_busy("analysis-test") and ran == []  # 0 waits at the gate; 1..3 were replaced by 4
    gate.set()
    qtbot.waitUntil(lambda: got == [4] and not st.job_busy("analysis-test"), timeout=10000)
    assert ran == [0, 4] and errors == []  # 0 ran but its answer was dropped; 1..3 never started
    st.shutdown()


def test_errors_of_the_newest_job_are_one_line_and_the_lane_goes_on(qtbot):
    st = SessionState()
    errors, got = [], []
    st.submit(rollout_job, [[1.0]], "mean", 0.0, key="analysis-rollout", on_result=got.append, on_error=errors.append,
              uses_model=False)
    qtbot.waitUntil(lambda: bool(errors) and not st.job_busy("analysis-rollout"), timeout=10000)
    assert errors[0].startswith("rollout needs attention shaped") and "\n" not in errors[0] and got == []
    st.submit(sum, [1, 2], key="analysis-rollout", on_result=got.append, on_error=errors.append, uses_model=False)
    qtbot.waitUntil(lambda: got == [3], timeout=10000)
    st.shutdown()


def test_lanes_are_independent(qtbot):
    st = SessionState()
    gate = threading.Event()
    got = []
    st.submit(lambda: gate.wait(10) and "slow", key="analysis-a", on_result=got.append, uses_model=False)
    st.submit(lambda: "quick", key="analysis-b", on_result=got.append, uses_model=False)
    qtbot.waitUntil(lambda: got == ["quick"], timeout=10000)  # b did not wait for a
    gate.set()
    qtbot.waitUntil(lambda: got == ["quick", "slow"], timeout=10000)
    st.shutdown()


def test_busy_lanes_names_the_lanes_with_work(qtbot):
    """What --screenshot waits on before it grabs a page whose own job (the lens, an analysis) is running."""
    st = SessionState()
    gate = threading.Event()
    got = []
    assert st.runner.busy_lanes() == []
    st.submit(lambda: gate.wait(10) and "slow", key="analysis-a", on_result=got.append, uses_model=False)
    st.submit(lambda: "quick", key="analysis-b", on_result=got.append, uses_model=False)
    qtbot.waitUntil(lambda: got == ["quick"], timeout=10000)
    qtbot.waitUntil(lambda: st.runner.busy_lanes() == ["analysis-a"], timeout=10000)
    gate.set()
    qtbot.waitUntil(lambda: st.runner.busy_lanes() == [], timeout=10000)
    st.shutdown()


def test_without_a_model_nothing_starts(qtbot):
    st = SessionState()
    assert st.submit(lambda model: 1, key="analysis-norms", on_result=print) is False
    assert not st.job_busy("analysis-norms")  # nothing in flight, nothing waiting
    st.shutdown()


def test_work_is_the_time_lane_jobs_ran_within_an_interval(qtbot):
    """What a forward shared its cores with (Runner.work): each lane's seconds inside the interval, a job in
    flight counted up to now, a stopped one until it ended; a job that waited in the pool's queue counts from
    when it began, and the share threshold leaves short overlaps out."""
    import time

    from attn_explorer.session.runner import Runner
    from attn_explorer.session.workers import live_workers

    runner = Runner()
    gates = [threading.Event() for _ in range(3)]
    began = []
    try:
        t0 = time.perf_counter()
        assert runner.work(t0 - 10, t0) == {}
        for i, g in enumerate(gates):  # on a 2-core machine the pool has 2 threads: the last ones wait their turn
            runner.submit(f"lane-{i}", Task(lambda g=g, i=i: began.append((i, time.perf_counter())) or g.wait(20)))
        qtbot.waitUntil(lambda: len(began) >= min(2, len(gates)), timeout=10000)
        time.sleep(0.2)
        snap = list(began)
        now = time.perf_counter()
        seen = runner.work(t0, now)
        for i, at in snap:  # each that began is counted from its start, within a scheduling hiccup
            assert abs(seen[f"lane-{i}"] - (now - at)) < 0.1
        assert set(seen) <= {f"lane-{i}" for i, _ in began}  # none that still waits in the queue
        assert runner.work(t0 - 10, t0) == {}  # before any began
        assert runner.work(t0, now + 100, share=0.5) == {}  # 0.2 s of 100: under the share
        runner.cancel_lane("lane-0")
        gates[0].set()
        qtbot.waitUntil(lambda: not runner.lane_busy("lane-0"), timeout=10000)
        ended = time.perf_counter()
        time.sleep(0.1)
        done = runner.work(t0, time.perf_counter())["lane-0"]  # stopped: its answer dropped, its work counted
        start0 = dict(began)[0]
        assert ended - start0 - 0.1 < done <= ended - start0 + 0.05
    finally:
        for g in gates:
            g.set()
        runner.shutdown()
        qtbot.waitUntil(lambda: live_workers() == 0, timeout=10000)
