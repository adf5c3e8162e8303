"""The runner, driven directly (no window; qtbot only runs the event loop): one job at a time, newest
request wins, stale results dropped, cancel, a failing job, loads during runs, background steps last."""
from __future__ import annotations

import threading

import pytest

from attn_explorer.errors import UserError
from attn_explorer.session.runner import Runner, Task
from attn_explorer.session.workers import live_workers


class Lab:
    """Jobs whose timing the test controls: each waits for `gate` (when closed), and records what ran."""

    def __init__(self):
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Semaphore(0)  # released as each job starts
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0  # most jobs running at once
        self.ran: list[str] = []  # jobs in the order they started
        self.got: list = []  # results, errors and progress, in the order the GUI thread saw them

    def job(self, name: str, fail: str | None = None, progress=None):
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.ran.append(name)
        self.entered.release()
        try:
            if progress is not None:
                progress(0.5, f"{name} half")
            assert self.gate.wait(10)
            if fail:
                raise UserError(fail) if fail != "memory" else MemoryError()
            return name
        finally:
            with self.lock:
                self.inside -= 1

    def task(self, name: str, fail: str | None = None) -> Task:
        return Task(self.job, (name, fail), on_result=lambda r: self.got.append(("result", r)),
                    on_error=lambda m: self.got.append(("error", m)))

    def wait_started(self, n: int = 1) -> None:
        for _ in range(n):
            assert self.entered.acquire(timeout=10)

    def results(self) -> list:
        return [g[1] for g in self.got if g[0] == "result"]


@pytest.fixture
def runner(qtbot):
    r = Runner()
    yield r
    r.shutdown()
    qtbot.waitUntil(lambda: live_workers() == 0, timeout=10000)


@pytest.fixture
def lab():
    return Lab()


def _settle(qtbot, runner):
    # idle, and every worker's last queued signal handled (the registry lets a worker go after its handlers)
    qtbot.waitUntil(lambda: runner.idle and live_workers() == 0, timeout=10000)


def test_newest_request_wins_and_the_ones_between_never_run(qtbot, runner, lab):
    from attn_explorer.session.runner import STOP_AFTER_S

    lab.gate.clear()
    runner.request(lambda: lab.task("first"))
    lab.wait_started()
    qtbot.wait(int(STOP_AFTER_S * 1000) + 100)  # no longer a young run
    for name in ("second", "third", "newest"):
        runner.request(lambda name=name: lab.task(name))
    assert runner.busy
    lab.gate.set()
    _settle(qtbot, runner)
    # a newer request stops the run in flight (issue 24: an edit ends a long forward): its answer is dropped
    assert lab.ran == ["first", "newest"] and lab.results() == ["newest"]
    assert not runner.busy and lab.most_inside == 1


def test_a_young_run_finishes_and_is_drawn_before_the_newest(qtbot, runner, lab):
    """Typing on a fast model: the run in flight is younger than STOP_AFTER_S, so it finishes and its answer
    arrives (the maps keep up with the typing); the newest request runs after it, the ones between never."""
    lab.gate.clear()
    runner.request(lambda: lab.task("first"))
    lab.wait_started()
    for name in ("second", "newest"):
        runner.request(lambda name=name: lab.task(name))
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.ran == ["first", "newest"] and lab.results() == ["first", "newest"]


def test_a_young_run_still_going_at_the_grace_age_is_stopped(qtbot, runner, lab):
    from attn_explorer.session.runner import STOP_AFTER_S

    lab.gate.clear()
    runner.request(lambda: lab.task("first"))
    lab.wait_started()
    runner.request(lambda: lab.task("newest"))
    qtbot.wait(int(STOP_AFTER_S * 1000) + 200)  # the grace ends while "first" still waits at its gate
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.results() == ["newest"]


def test_a_burst_of_twenty_requests_during_one_run_makes_at_most_two_runs(qtbot, runner, lab):
    lab.gate.clear()
    runner.request(lambda: lab.task("running"))
    lab.wait_started()
    for k in range(20):
        runner.request(lambda k=k: lab.task(f"burst {k}"))
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.ran == ["running", "burst 19"]  # the nineteen between never ran
    assert lab.results()[-1] == "burst 19"


def test_a_request_is_made_into_a_job_only_when_it_starts(qtbot, runner, lab):
    lab.gate.clear()
    seen = {"text": "old"}
    runner.request(lambda: lab.task("first"))
    lab.wait_started()
    runner.request(lambda: lab.task(seen["text"]))
    seen["text"] = "typed meanwhile"  # the input changed after the request: the run sees the new one
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.ran == ["first", "typed meanwhile"]


def test_nothing_to_run_is_no_job(qtbot, runner, lab):
    runner.request(lambda: None)
    _settle(qtbot, runner)
    assert lab.ran == [] and lab.got == [] and not runner.busy


def test_cancel_drops_the_run_in_flight_and_the_waiting_one(qtbot, runner, lab):
    lab.gate.clear()
    runner.request(lambda: lab.task("in flight"))
    lab.wait_started()
    runner.request(lambda: lab.task("waiting"))
    runner.cancel()
    assert not runner.busy  # the job still finishing in its thread is nobody's business now
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.got == [] and lab.ran == ["in flight"]
    runner.request(lambda: lab.task("after"))  # and the runner still works
    _settle(qtbot, runner)
    assert lab.results() == ["after"]


@pytest.mark.parametrize("fail, line", [("no such token", "no such token"), ("memory", "MemoryError")])
def test_a_failing_job_reports_one_line_and_the_next_request_runs(qtbot, runner, lab, fail, line):
    runner.request(lambda: lab.task("bad", fail))
    _settle(qtbot, runner)
    assert lab.got == [("error", line)]
    runner.request(lambda: lab.task("good"))
    _settle(qtbot, runner)
    assert lab.got == [("error", line), ("result", "good")]


def test_a_load_during_a_run_drops_the_old_models_result(qtbot, runner, lab):
    lab.gate.clear()
    runner.request(lambda: lab.task("old model run"))
    lab.wait_started()
    runner.load(lab.task("load"))
    assert runner.loading and runner.busy
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.ran == ["old model run", "load"] and lab.results() == ["load"]
    assert lab.most_inside == 1 and not runner.loading


def test_a_run_asked_for_during_a_load_runs_after_it(qtbot, runner, lab):
    lab.gate.clear()
    runner.load(lab.task("load"))
    lab.wait_started()
    runner.request(lambda: lab.task("run"))
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.ran == ["load", "run"] and lab.results() == ["load", "run"]


def test_a_newer_load_replaces_the_waiting_one_and_stops_the_one_in_flight(qtbot, runner, lab):
    lab.gate.clear()
    runner.load(lab.task("load a"))
    lab.wait_started()
    runner.load(lab.task("load b"))
    runner.load(lab.task("load c"))
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.ran == ["load a", "load c"] and lab.results() == ["load c"]


def test_a_failed_load_serves_the_run_it_stopped_on_the_old_model(qtbot, runner, lab):
    lab.gate.clear()
    runner.request(lambda: lab.task("newest input"))
    lab.wait_started()
    runner.load(lab.task("broken folder", fail="not a model folder"))
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.ran == ["newest input", "broken folder", "newest input"]
    assert lab.got == [("error", "not a model folder"), ("result", "newest input")]


def test_load_progress_arrives_and_stops_when_the_load_is_replaced(qtbot, runner, lab):
    got = []
    runner.load(Task(lab.job, ("load",), on_result=got.append, on_progress=lambda f, m: got.append((f, m))))
    _settle(qtbot, runner)
    assert got == [(0.5, "load half"), "load"]


def test_background_steps_run_one_at_a_time_and_give_way_to_runs(qtbot, runner, lab):
    steps = [f"step {i}" for i in range(4)]

    def next_step():
        return lab.task(steps.pop(0)) if steps else None

    lab.gate.clear()
    runner.background = next_step
    runner.wake()
    lab.wait_started()  # step 0 is running
    runner.request(lambda: lab.task("user run"))
    assert runner.busy  # a run waits; background steps alone do not make the runner busy
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.ran == ["step 0", "user run", "step 1", "step 2", "step 3"]
    assert lab.most_inside == 1


def test_cancel_background_drops_the_step_in_flight(qtbot, runner, lab):
    steps = ["step 0", "step 1"]
    lab.gate.clear()
    runner.background = lambda: lab.task(steps.pop(0)) if steps else None
    runner.wake()
    lab.wait_started()
    steps.clear()
    runner.cancel_background()
    lab.gate.set()
    _settle(qtbot, runner)
    assert lab.ran == ["step 0"] and lab.got == []


def test_busy_changed_reports_each_change_once(qtbot, runner, lab):
    seen = []
    runner.busy_changed.connect(seen.append)
    lab.gate.clear()
    runner.request(lambda: lab.task("a"))
    lab.wait_started()
    runner.request(lambda: lab.task("b"))
    lab.gate.set()
    _settle(qtbot, runner)
    assert seen == [True, False]
