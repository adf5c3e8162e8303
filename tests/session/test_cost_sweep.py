"""The cost lab's session object: the sweep as a generator job, and the model-q/k/v comparison kept true."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

from attn_explorer.session.cost_sweep import CostSweep, largest_fitting_n  # noqa: E402

SMALL = dict(impls=["chunked", "linear"], heads=2, d_k=16, repeats=2, window=8)


def test_points_and_progress_arrive_as_plain_data_and_one_sweep_runs_at_a_time(qtbot):
    sweep = CostSweep()
    points, progress = [], []
    sweep.point_measured.connect(points.append)
    sweep.progressed.connect(lambda *a: progress.append(a))
    with qtbot.waitSignal(sweep.sweep_finished, timeout=30000) as done:
        assert sweep.start(SMALL | {"ns": [32, 64, 128]})
        assert not sweep.start(SMALL | {"ns": [32]})  # already running
    assert done.args == ["done"]
    assert [(p["n"], p["impl"]) for p in points] == [(n, i) for n in (32, 64, 128) for i in ("chunked", "linear")]
    assert all(isinstance(p, dict) and p["status"] == "ok" for p in points)
    fractions = [f for f, _, _ in progress]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert progress[0][2] == "" and any(left.endswith(" left") for _, _, left in progress)
    assert not sweep.is_running


def test_cancel_ends_the_sweep_as_cancelled(qtbot):
    sweep = CostSweep()
    points = []
    sweep.point_measured.connect(points.append)
    with qtbot.waitSignal(sweep.point_measured, timeout=30000):
        sweep.start(SMALL | {"ns": [64, 128, 256, 512, 1024, 2048, 4096], "repeats": 5})
    with qtbot.waitSignal(sweep.sweep_finished, timeout=30000) as done:
        sweep.cancel()
    assert done.args == ["cancelled"] and not sweep.is_running
    kept = len(points)
    qtbot.waitUntil(lambda: not sweep.busy, timeout=30000)  # the call in flight ended: whatever it made is dropped
    assert len(points) == kept < 14


def test_the_sweep_and_the_comparison_run_in_the_session_lanes(qtbot, loaded):
    state = loaded
    sweep = CostSweep(state)
    with qtbot.waitSignal(sweep.sweep_finished, timeout=30000) as done:
        assert sweep.start(SMALL | {"ns": [32, 64]})
        assert state.job_busy("cost-sweep")
    assert done.args == ["done"]
    qtbot.waitUntil(lambda: not state.job_busy("cost-sweep"), timeout=30000)
    with qtbot.waitSignal(sweep.qkv_measured, timeout=30000):
        assert sweep.measure_qkv({"impls": ["naive", "window"], "window": 2})
        assert state.job_busy("cost-qkv") and sweep.measuring_qkv
    assert not sweep.measuring_qkv


def test_bad_settings_end_as_one_failed_line(qtbot):
    sweep = CostSweep()
    with qtbot.waitSignal(sweep.sweep_finished, timeout=30000) as done:
        sweep.start(SMALL | {"ns": [64], "heads": 0})
    assert done.args == ["failed: heads must be a positive integer, got 0"]


def test_the_guard_finds_the_largest_n_that_fits():
    settings = {"impls": ["naive"], "heads": 12, "d_k": 64}
    ns = [64 << i for i in range(11)]
    assert largest_fitting_n(settings, 200e6, ns) == 1024  # naive at 2048 needs ~0.43 GB of scores and more
    assert largest_fitting_n(settings | {"impls": ["naive", "chunked"]}, 200e6, ns) > 2048
    assert largest_fitting_n(settings, 1000, ns) is None


@pytest.fixture
def loaded(qtbot):
    from attn_explorer.session.state import SessionState
    from tests.gui.conftest import cached_loader

    state = SessionState(loader=cached_loader, device="cpu")
    state.load_model("textbook")
    qtbot.waitUntil(lambda: state.result is not None, timeout=60000)
    yield state
    state.shutdown()


def test_a_comparison_that_finishes_after_the_layer_changed_is_dropped(qtbot, loaded):
    import threading

    state = loaded
    release = threading.Event()

    def slow_probe(model, x, layer, **kw):  # holds the job until the test lets it go
        from attn_explorer.api.probe import layer_qkv

        release.wait(10)
        return layer_qkv(model, x, layer, **kw)

    sweep = CostSweep(state, probe=slow_probe)
    measured = []
    sweep.qkv_measured.connect(measured.append)
    assert sweep.qkv_target().startswith("textbook, layer 0, this input")
    assert sweep.measure_qkv({"impls": ["naive", "window"], "window": 2})
    state.select(layer=1)  # the user moves on while it runs
    release.set()
    qtbot.waitUntil(lambda: not state.job_busy("cost-qkv"), timeout=30000)  # its answer has come and gone
    assert measured == [] and sweep.qkv_result is None  # it would describe layer 0, which is no longer shown

    assert sweep.measure_qkv({"impls": ["naive", "window"], "window": 2})
    with qtbot.waitSignal(sweep.qkv_measured, timeout=30000) as got:
        pass
    assert got.args[0]["layer"] == 1 and got.args[0]["model"] == "textbook"
    with qtbot.waitSignal(sweep.qkv_cleared, timeout=5000):
        state.set_text("A different sentence now.")
    assert sweep.qkv_result is None


def test_points_measured_beside_a_model_run_say_so_and_make_the_timings_noisy(qtbot):
    """Seen in a real window: pressing Measure n on the Cost page, then typing, ran the model's forward beside the
    measurement; its points were drawn and fitted as if measured alone. A point whose measurement overlapped
    other work (here a model run in flight) carries what ran beside it, and the noise verdict names it; points
    measured alone carry nothing."""
    import threading

    from attn_explorer.session.cost_sweep import noise_line
    from attn_explorer.session.runner import Task

    sweep = CostSweep()
    gate = threading.Event()
    sweep._runner.request(lambda: Task(lambda: gate.wait(30)))  # a model run in flight
    points = []
    sweep.point_measured.connect(points.append)
    try:
        with qtbot.waitSignal(sweep.sweep_finished, timeout=30000):
            assert sweep.start(SMALL | {"ns": [64, 128]})
    finally:
        gate.set()
    assert points and all("model-run" in p["beside"] for p in points)
    assert "measured beside other work" in noise_line(points)
    qtbot.waitUntil(lambda: sweep._runner.idle, timeout=30000)
    alone = []
    sweep.point_measured.disconnect(points.append)
    sweep.point_measured.connect(alone.append)
    with qtbot.waitSignal(sweep.sweep_finished, timeout=30000):
        assert sweep.start(SMALL | {"ns": [64, 128]})
    assert alone and not any(p.get("beside") for p in alone)
    assert "beside" not in noise_line(alone)
