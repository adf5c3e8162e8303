"""The sequence-length panel's n sweep: points stream in, a quadratic is fitted, the view is untouched."""
from __future__ import annotations

import numpy as np

from attn_explorer.session.sweep import sweep_lengths, time_fit
from tests.gui.conftest import cached_model, sample


def _counter(signal):
    got = []
    signal.connect(lambda *a: got.append(a))
    return got


def steady_ms(n: float) -> float:
    return 2e-4 * n * n + 0.05 * n + 3.0


def _steady_clock(monkeypatch, first_ms: float | None = None):
    """The sweep's real forward passes, reported with a fixed quadratic time: on a loaded 2-core machine
    the textbook model's few-ms timings are noise, and the GUI then rightly refuses to fit them.
    first_ms: the very first pass reports this instead (a cold start: caches, threads, allocations)."""
    from attn_explorer.session import sweep as sweep_mod

    real = sweep_mod.sweep_job
    calls = []

    def steady(model, x, kw, want, reps):
        n, _ms, repeated = real(model, x, kw, want, reps)
        calls.append(n)
        return n, first_ms if first_ms is not None and len(calls) == 1 else steady_ms(n), repeated

    monkeypatch.setattr(sweep_mod, "sweep_job", steady)
    return calls


def test_sweep_draws_points_and_fit_without_touching_the_view(make_window, qtbot, monkeypatch):
    _steady_clock(monkeypatch)
    w = make_window(model="textbook", view="grid")
    st, panel = w.state, w.seq_panel
    shown, image = st.result, w.grid.last_image.copy()
    ready = _counter(st.attention_ready)
    points = _counter(st.sweep_point_measured)
    with qtbot.waitSignal(st.sweep_finished, timeout=60000) as done:
        panel.sweep_button.click()
        assert st.sweeping and not panel.sweep_button.isEnabled() and panel.cancel_button.isEnabled()
    assert done.args == [True]
    # one point per length, streamed as they came, from 8 up to the model's 512 positions
    ns = [p[0] for p in points]
    assert ns == sweep_lengths(st.info) and ns[0] == 8 and ns[-1] == 512
    # what the user sees: a dot per length at its median, the fit drawn over the measured n, and its reading
    xs, ys = panel.sweep_scatter.getData()
    assert list(xs) == ns
    np.testing.assert_allclose(ys, [steady_ms(n) for n in ns])
    cx, cy = panel.curve.getData()
    assert cx[0] == 8 and cx[-1] == 512
    np.testing.assert_allclose(cy, [steady_ms(n) for n in cx], rtol=1e-6)
    text = panel.sweep_readout.text()
    assert "input repeated to reach n" in text and "·n²" in text
    assert f"doubling n from 256 to 512 multiplies time by <b>×{steady_ms(512) / steady_ms(256):.2f}</b>" in text
    assert panel.progress.value() == panel.progress.maximum() and panel.sweep_button.isEnabled()
    # timing only: the attention on screen is the one from before
    assert ready == [] and st.result is shown
    np.testing.assert_array_equal(w.grid.last_image, image)
    assert st.result.num_tokens == 12 and panel.slider.value() == 12


def test_the_warm_up_pass_is_not_a_point(make_window, qtbot, monkeypatch):
    """A cold first forward pass (injected: 250 ms against a few ms) is the sweep's warm-up: no dot, no fit."""
    calls = _steady_clock(monkeypatch, first_ms=250.0)
    w = make_window(model="textbook", view="grid")
    st, panel = w.state, w.seq_panel
    with qtbot.waitSignal(st.sweep_finished, timeout=60000) as done:
        st.start_sweep(repeats=1)
    assert done.args == [True]
    ns = sweep_lengths(st.info)
    assert calls == [ns[0]] + ns  # one pass more than the points: the warm-up at the first length
    _, ys = panel.sweep_scatter.getData()
    assert 250.0 not in list(ys) and max(ys) == steady_ms(512)
    np.testing.assert_allclose(panel.fit, time_fit([(n, steady_ms(n)) for n in ns]).coeffs)
    assert "noisy" not in panel.sweep_readout.text()


def test_cancel_stops_the_sweep(make_window, qtbot):
    w = make_window(model="minilm")
    st, panel = w.state, w.seq_panel
    points = _counter(st.sweep_point_measured)
    with qtbot.waitSignal(st.sweep_point_measured, timeout=60000):
        panel.sweep_button.click()
    with qtbot.waitSignal(st.sweep_finished, timeout=5000) as done:
        panel.cancel_button.click()
    assert done.args == [False] and not st.sweeping
    n_before = len(points)
    # the step in flight at the cancel ends; the runner then asks the sweep for more and gets nothing
    qtbot.waitUntil(lambda: st.runner.idle, timeout=60000)
    assert len(points) == n_before < len(sweep_lengths(st.info))
    assert st.sweep_points == [(n, ms) for n, ms in points]
    assert panel.sweep_button.isEnabled() and not panel.cancel_button.isEnabled()
    assert "stopped" in panel.progress.format()


def test_typing_during_a_sweep_is_served_and_the_sweep_completes(make_window, qtbot):
    w = make_window(model="textbook")
    st = w.state
    finished = _counter(st.sweep_finished)
    with qtbot.waitSignal(st.sweep_point_measured, timeout=60000):
        assert st.start_sweep()
    w.input_panel.text.setPlainText("brand new words arrive")
    qtbot.waitUntil(lambda: st.result.tokens == ["brand", "new", "words", "arrive"], timeout=20000)
    assert st.sweeping  # the edit went between two sweep steps
    qtbot.waitUntil(lambda: bool(finished), timeout=60000)
    assert finished == [(True,)] and len(st.sweep_points) == len(sweep_lengths(st.info))
    assert st.result.tokens == ["brand", "new", "words", "arrive"]


def test_loading_another_model_cancels_the_sweep(make_window, qtbot):
    w = make_window(model="textbook")
    st = w.state
    with qtbot.waitSignal(st.sweep_point_measured, timeout=60000):
        st.start_sweep()
    with qtbot.waitSignal(st.sweep_finished, timeout=5000) as done:
        st.load_model("minilm")
    assert done.args == [False]
    qtbot.waitUntil(lambda: st.info.name == "minilm" and not st.busy, timeout=60000)
    assert st.sweep_points == [] and w.seq_panel.sweep_scatter.getData()[0].size == 0


def test_image_sweep_grows_the_patch_grid(make_window, qtbot):
    w = make_window(model="textbook-vit", image=sample("coffee"), view="overlay")
    st, panel = w.state, w.seq_panel
    grids = sweep_lengths(st.info)  # patch 16, default 224 px: 4×4 .. 28×28 patches
    assert grids[0] == 4 and grids[-1] == 28
    with qtbot.waitSignal(st.sweep_finished, timeout=120000):
        st.start_sweep(repeats=1)
    assert [n for n, _ in st.sweep_points] == [g * g + 1 for g in grids]  # patches + [CLS]
    assert st.result.grid == (14, 14)  # the overlay still shows the default size
    assert "input repeated" not in panel.sweep_readout.text()


def test_one_point_gets_a_padded_axis(make_window, qtbot):
    w = make_window(model="textbook")
    panel, st = w.seq_panel, w.state
    qtbot.waitUntil(lambda: len(panel.live_points.getData()[0]) == 1)
    assert len(st.timings) == 1
    (x0, x1), (y0, y1) = panel.plot.getViewBox().viewRange()
    n, ms = st.timings[0]
    assert x0 == 0 and x1 > n + 1 and y0 == 0 and y1 > ms
    cx, _ = panel.curve.getData()
    assert panel.fit is None and (cx is None or len(cx) == 0)  # one point: no fit, no curve


def test_slider_range_is_the_whole_input(make_window, qtbot):
    w = make_window(model="textbook", text=" ".join(["word"] * 40))
    st, panel = w.state, w.seq_panel
    st.set_max_tokens(10)
    qtbot.waitUntil(lambda: st.result.num_tokens == 10 and panel.slider.value() == 10, timeout=20000)
    assert st.result.total_tokens == 40 and panel.slider.maximum() == 40
    long_text = " ".join(["word"] * 700)  # longer than the model's 512 positions
    st.set_text(long_text)
    qtbot.waitUntil(lambda: st.result.total_tokens == 700 and panel.slider.maximum() == 512, timeout=20000)
    assert panel.slider.value() == st.result.num_tokens == 10  # the cut is kept


def test_the_panel_draws_the_one_time_fit(make_window, qtbot):
    """One copy of the fit: the panel shows what the session's time_fit (the cost floor's) says."""
    from attn_explorer.gui.widgets import stats

    assert not any(hasattr(stats, f) for f in ("sound_fit", "doubling_factor", "quadratic_share"))
    w = make_window(model="textbook")
    st, panel = w.state, w.seq_panel
    ns = [8, 16, 32, 64, 128, 256, 512]
    st.sweep_points = [(n, 1e-4 * n * n + 0.01 * n + 1) for n in ns]
    panel.redraw_plot()
    fit = time_fit(st.sweep_points)
    assert fit == st.sweep.fit()
    np.testing.assert_allclose(panel.fit, fit.coeffs)
    text = panel.sweep_readout.text()
    assert f"multiplies time by <b>×{fit.doubling:.2f}</b>" in text
    assert f"the n² term is {fit.quadratic_share:.0%} of the fitted time" in text
    st.sweep_points = [(n, 1.0) for n in ns[:3]]
    panel.redraw_plot()
    assert panel.fit is None and panel.no_fit.text() == time_fit(st.sweep_points).reason


def test_sweep_lengths_are_log_spaced_to_the_model_limit():
    ns = sweep_lengths(cached_model("minilm").info)
    assert ns[0] == 8 and ns[-1] == 512 and len(ns) >= 6
    ratios = np.diff(np.log(ns))
    assert ratios.max() < 2 * ratios.min()


def test_noisy_sweep_is_called_noisy(make_window, qtbot):
    w = make_window(model="textbook")
    st, panel = w.state, w.seq_panel
    st.sweep_points = [(8, 1.0), (32, 1.5), (64, 2.0), (128, 4.0), (256, 10.0), (512, 30.0)]  # enough for a fit
    panel.redraw_plot()
    assert "noisy" not in panel.sweep_readout.text() and "×" in panel.sweep_readout.text()
    st.sweep_points = [(8, 40.0), (32, 1.5), (64, 2.0), (128, 30.0), (256, 10.0), (512, 3.0)]  # another program stole the CPU
    panel.redraw_plot()
    assert "noisy" in panel.sweep_readout.text()


def test_a_failing_sweep_step_stops_with_a_banner(make_window, qtbot, monkeypatch):
    from attn_explorer.errors import UserError

    w = make_window(model="textbook")
    st = w.state
    model = cached_model("textbook")  # the very model the window loaded
    plain = model.run

    def fussy(x, **kw):
        if kw.get("max_tokens", 0) > 100:
            raise UserError("too long for this test")
        return plain(x, **kw)

    monkeypatch.setattr(model, "run", fussy)
    with qtbot.waitSignal(st.sweep_finished, timeout=60000) as done:
        st.start_sweep(repeats=1)
    assert done.args == [False] and not st.sweeping
    assert w.banner.isVisible() and "n sweep stopped: too long for this test" in w.banner.text
    assert all(n <= 100 for n, _ in st.sweep_points) and len(st.sweep_points) >= 3
    assert w.seq_panel.sweep_button.isEnabled()


def test_steps_timed_beside_other_work_are_measured_again_and_then_marked(make_window, qtbot, monkeypatch):
    """The n sweep timed its forward passes whatever else ran (a lesson's job, the Cost page's sweep), and drew
    them as the model's times. A step timed beside other work is measured again (up to sweep.RETRIES times); one
    still beside it then is kept and named on the panel. A sweep alone marks nothing."""
    import threading

    from attn_explorer.session import sweep as sweep_mod

    calls = _steady_clock(monkeypatch)
    w = make_window(model="textbook", view="grid")
    st, panel = w.state, w.seq_panel
    gate = threading.Event()
    assert st.submit(lambda: gate.wait(60), key="test-side-job", uses_model=False)
    try:
        with qtbot.waitSignal(st.sweep_finished, timeout=60000) as done:
            panel.sweep_button.click()
    finally:
        gate.set()
    assert done.args == [True]
    ns = sweep_lengths(st.info)
    assert st.sweep.beside == set(ns)
    assert len(calls) == 1 + len(ns) * st.sweep_repeats * (1 + sweep_mod.RETRIES)  # a warm-up, then each step again
    assert "beside other jobs" in panel.progress.format() and "test-side-job" in panel.progress.toolTip()
    qtbot.waitUntil(lambda: not st.job_busy("test-side-job"), timeout=10000)
    with qtbot.waitSignal(st.sweep_finished, timeout=60000):
        panel.sweep_button.click()
    assert st.sweep.beside == set() and panel.progress.format() == "sweep done" and panel.progress.toolTip() == ""
