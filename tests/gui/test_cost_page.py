"""The Cost page: a short sweep streams points onto the plots, Cancel stops it, failures stay local,
and what it shows is true: spreads, large-n slopes, the noise verdict, labelled errors, the time left,
the model's own q, k, v, and a layout that fits at 1024×700."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import QPoint, Qt  # noqa: E402
from PySide6.QtWidgets import QLabel  # noqa: E402

from attn_explorer.core import efficient  # noqa: E402
from attn_explorer.gui.cost.page import N_MIN, CostPage  # noqa: E402

SWEEP_TIMEOUT_MS = 60000
ALL = ("naive", "chunked", "window", "linear", "sdpa")
# What the page gets inside the main window at 1024×700: the side panels take ~400 px, the menu,
# toolbar, tabs and status bar ~115 px (measured on `main.py --view cost --size 1024x700 --screenshot`).
PAGE_AT_1024x700 = (610, 585)
PAGE_AT_1920x1080 = (1460, 960)


@pytest.fixture
def page(qtbot):
    p = CostPage()
    qtbot.addWidget(p)
    p.resize(1200, 800)
    p.show()
    p.heads_spin.setValue(2)
    p.dk_spin.setValue(32)
    p.window_spin.setValue(16)
    p.repeats_spin.setValue(1)
    yield p
    p.shutdown()


def jittery():
    """A stand-in for measure.timed_call: n² ms, every third run 3× slower, as on a busy machine."""
    calls = []

    def timed_call(call, device):
        n = call().shape[-2]
        calls.append(n)
        return 1e-4 * n * n * (3.0 if len(calls) % 3 == 0 else 1.0)

    return timed_call


def run(qtbot, page: CostPage) -> str:
    with qtbot.waitSignal(page.sweep_finished, timeout=SWEEP_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(page.run_button, Qt.LeftButton)
    return blocker.args[0]


def test_a_short_sweep_puts_every_point_on_the_plots(qtbot, page):
    page.n_values = [64, 128, 256, 512]
    streamed = []
    page.point_measured.connect(streamed.append)
    assert run(qtbot, page) == "done"
    assert len(page.points) == len(streamed) == 4 * 5
    assert {(p["n"], p["impl"]) for p in page.points} == {(n, v) for n in (64, 128, 256, 512) for v in ALL}
    assert all(p["status"] == "ok" for p in page.points)
    for name, (t_curve, m_curve) in page.plots.curves.items():
        assert list(t_curve.xData) == [64, 128, 256, 512], name
        assert len(m_curve.yData) == 4, name
    assert page.table.rowCount() == 20
    naive = page.plots.legend_row("naive")
    assert naive[0] == "● naive" and re.fullmatch(r"(1\.[6-9]|2\.0)\d \(n ≥ \d+\)", naive[2]), naive
    fits = page.slopes()
    assert fits["window"]["memory"] == pytest.approx(1.0, abs=0.05)
    assert page.plots.legend_row("window")[2].startswith(f"{fits['window']['memory']:.2f} (n ≥ ")
    # the approximations show their error next to their slopes
    assert re.fullmatch(r"[\d.e+-]+ at n = 512", page.plots.legend_row("linear")[3]), page.plots.legend_row("linear")
    assert page.run_button.isEnabled() and not page.cancel_button.isEnabled()
    assert page.progress_bar.value() == page.progress_bar.maximum()


def test_each_time_point_shows_its_fastest_to_slowest_spread(qtbot, page):
    page.repeats_spin.setValue(3)
    page.n_values = [64, 128, 256]
    assert run(qtbot, page) == "done"
    for name, bars in page.plots.error_bars.items():
        pts = sorted((p for p in page.points if p["impl"] == name), key=lambda p: p["n"])
        assert bars.isVisible() and len(bars.opts["x"]) == 3, name
        # drawn in the plot's log10 coordinates: from log10(fastest) to log10(slowest) around log10(median)
        for i, p in enumerate(pts):
            y = bars.opts["y"][i]
            assert 10 ** (y + bars.opts["top"][i]) == pytest.approx(p["ms_max"], rel=1e-6)
            assert 10 ** (y - bars.opts["bottom"][i]) == pytest.approx(p["ms_min"], rel=1e-6)
    spread_col = [page.table.item(r, 3).text() for r in range(page.table.rowCount())]
    assert all(re.fullmatch(r"[\d.e+]+–[\d.e+]+", s) for s in spread_col), spread_col


def test_slopes_are_fitted_over_large_n_and_the_plot_says_so(qtbot, page):
    page.n_values = [64, 128, 256, 512]
    assert run(qtbot, page) == "done"
    assert "fitted over large n only (cost ≥ 4× its smallest)" in page.plots.fit_note.text()
    assert "fixed per-call overhead no longer hides the growth" in page.plots.fit_note.toolTip()
    fits = page.slopes()
    for name in ALL:  # every fit starts past the smallest n (or there is none: the cost never grew 4×)
        assert fits[name]["memory_from"] is None or fits[name]["memory_from"] > 64, (name, fits[name])


def test_noisy_timings_are_flagged_on_the_page(qtbot, page, monkeypatch):
    from attn_explorer.cost import measure

    monkeypatch.setattr(measure, "timed_call", jittery())
    for name, box in page.variant_boxes.items():
        box.setChecked(name in ("naive", "linear"))
    page.repeats_spin.setValue(3)
    page.n_values = [128, 256, 512, 1024]
    assert run(qtbot, page) == "done"
    assert not page.plots.noise_label.isHidden()
    assert page.plots.noise_label.text().startswith("⚠ These timings are noisy")
    assert page.plots.noise_label.toolTip().startswith("These timings are noisy (")
    page.window_spin.setValue(32)  # other settings: the points, and every line about them, go
    assert page.points == [] and page.table.rowCount() == 0
    assert page.plots.noise_label.isHidden()
    assert page.status_label.text() == "Press Run to measure." and page.progress_bar.value() == 0
    assert all(not cell.isVisible() for cells in page.plots.legend_cells.values() for cell in cells[1:])


def test_the_error_column_says_what_the_number_is(page):
    header = page.table.horizontalHeaderItem(page.table.ERROR_COLUMN)
    assert header.text().replace("\n", " ") == "relative error of the output vs exact"
    assert "‖out − exact‖ / ‖exact‖" in header.toolTip()


def test_the_time_left_is_shown_while_sweeping(qtbot, page):
    for name, box in page.variant_boxes.items():
        box.setChecked(name in ("chunked", "linear"))
    page.n_values = [64, 128, 256, 512]
    page.repeats_spin.setValue(2)
    shown = []
    page.sweep.progressed.connect(lambda *a: shown.append(page.eta_label.text()))
    assert run(qtbot, page) == "done"
    assert shown[0] == "estimating time left…"  # nothing measured yet
    estimates = [s for s in shown if re.fullmatch(r"about \d+( min \d\d)? s left|about \d+ min left", s)]
    assert len(set(estimates)) >= 1 and len(estimates) >= len(shown) // 2, shown
    assert page.eta_label.text() == ""  # finished: nothing left to estimate


def test_cancel_stops_the_sweep(qtbot, page):
    for name, box in page.variant_boxes.items():
        box.setChecked(name == "chunked")
    page.heads_spin.setValue(4)
    page.n_values = [1024, 2048, 4096, 8192, 16384, 32768]
    page.repeats_spin.setValue(3)
    with qtbot.waitSignal(page.point_measured, timeout=SWEEP_TIMEOUT_MS):
        qtbot.mouseClick(page.run_button, Qt.LeftButton)
    assert page.cancel_button.isEnabled() and not page.run_button.isEnabled()
    curve = page.plots.curves["chunked"][0]
    qtbot.waitUntil(lambda: curve.xData is not None and len(curve.xData) >= 1)  # drawn while still running
    assert page.is_running
    with qtbot.waitSignal(page.sweep_finished, timeout=SWEEP_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(page.cancel_button, Qt.LeftButton)
    assert blocker.args == ["cancelled"]
    kept = len(page.points)
    assert 1 <= kept < 6
    qtbot.waitUntil(lambda: not page.sweep.busy, timeout=SWEEP_TIMEOUT_MS)  # the call in flight ended
    assert len(page.points) == kept  # and nothing it made arrived after the end
    assert page.run_button.isEnabled() and not page.cancel_button.isEnabled()
    assert "cancelled" in page.status_label.text() and page.eta_label.text() == ""


def test_a_failing_variant_marks_its_points_and_keeps_the_rest(qtbot, page, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: not enough memory")

    monkeypatch.setattr(efficient, "linear", out_of_memory)
    page.n_values = [64, 128]
    assert run(qtbot, page) == "done"
    status = {(p["n"], p["impl"]): p["status"] for p in page.points}
    assert status[64, "linear"] == status[128, "linear"] == "failed"
    assert [s for (n, impl), s in status.items() if impl != "linear"] == ["ok"] * 8
    notes = [page.table.item(r, 6).text() for r in range(page.table.rowCount())
             if page.table.item(r, 1).text() == "linear"]
    assert notes == ["failed: RuntimeError: DefaultCPUAllocator: not enough memory"] * 2
    curve = page.plots.curves["linear"][0]
    assert curve.xData is None or len(curve.xData) == 0


def test_oversized_points_are_skipped_and_marked(qtbot, page):
    page.budget_override = 3_000_000
    page.n_values = [64, 1024]
    assert run(qtbot, page) == "done"
    naive_1024 = next(p for p in page.points if (p["n"], p["impl"]) == (1024, "naive"))
    assert naive_1024["status"] == "skipped" and naive_1024["message"].startswith("skipped: would need")
    assert 1024 in list(page.plots.not_run.xData)


def test_slider_steps_double_n_and_the_readout_gives_the_matrix_bytes(qtbot, page):
    page.heads_spin.setValue(12)
    page.n_slider.setValue(0)
    assert page.current_n == N_MIN
    page.n_slider.setValue(4)
    assert page.current_n == 1024
    assert page.n_values == [64, 128, 256, 512, 1024]
    assert "50.3 MB" in page.readout.text()  # 12 heads × 1024² × 4 bytes
    assert page.plots.n_markers[0].value() == pytest.approx(3.0103, abs=1e-3)  # log10(1024)
    top_all = page.n_slider.maximum()
    for name, box in page.variant_boxes.items():
        box.setChecked(name == "naive")
    assert page.n_slider.maximum() < top_all  # the n×n matrix runs out of budget first


def _handle(slider) -> QPoint:
    """The centre of the slider's handle, where a user grabs it."""
    from PySide6.QtWidgets import QStyle, QStyleOptionSlider

    opt = QStyleOptionSlider()
    slider.initStyleOption(opt)
    return slider.style().subControlRect(QStyle.CC_Slider, opt, QStyle.SC_SliderHandle, slider).center()


def _drag(qtbot, slider, value: int) -> None:
    """Grab the handle, move the slider to `value` (as a drag does) and let go."""
    qtbot.mousePress(slider, Qt.LeftButton, pos=_handle(slider))
    assert slider.isSliderDown()
    slider.setValue(value)
    qtbot.mouseRelease(slider, Qt.LeftButton, pos=_handle(slider))


def test_releasing_the_slider_measures_that_n(qtbot, page):
    for name, box in page.variant_boxes.items():
        box.setChecked(name in ("chunked", "linear"))
    page.n_slider.setValue(1)
    with qtbot.waitSignal(page.sweep_finished, timeout=SWEEP_TIMEOUT_MS):
        _drag(qtbot, page.n_slider, 2)
    assert sorted((p["n"], p["impl"]) for p in page.points) == [(256, "chunked"), (256, "linear")]


def test_clicking_the_handle_without_moving_it_measures_nothing(qtbot, page):
    started = []
    page.sweep_started.connect(lambda: started.append(True))
    page.n_slider.setValue(2)
    qtbot.mouseClick(page.n_slider, Qt.LeftButton, pos=_handle(page.n_slider))
    assert page.current_n == 256  # the click landed on the handle and moved nothing
    assert not page.is_running and started == []  # and started nothing (a run would start on release)
    # the next user action is served at once, and no sweep job was started before it
    with qtbot.waitSignal(page.sweep_finished, timeout=SWEEP_TIMEOUT_MS) as done:
        qtbot.mouseClick(page.measure_button, Qt.LeftButton)
    assert done.args == ["done"] and len(started) == 1
    assert {p["n"] for p in page.points} == {256}


def test_a_long_run_waits_for_the_measure_button(qtbot, page):
    page.heads_spin.setValue(12)
    page.dk_spin.setValue(64)
    page.repeats_spin.setValue(3)
    page.n_slider.setValue(3)
    big = page.n_slider.maximum()  # n = 65,536: minutes of naive attention on a CPU
    _drag(qtbot, page.n_slider, big)
    assert page.current_n >= 16384 and not page.is_running
    text = page.status_label.text()
    assert re.fullmatch(rf"n = {page.current_n:,} would take about .+: press Measure n to run it", text), text
    assert page.measure_button.isEnabled() and page.measure_button.text() == "Measure n"
    # a quick n still runs on release, with no button
    page.heads_spin.setValue(2)
    page.dk_spin.setValue(32)
    page.n_slider.setValue(1)
    with qtbot.waitSignal(page.sweep_finished, timeout=SWEEP_TIMEOUT_MS):
        _drag(qtbot, page.n_slider, 0)
    assert {p["n"] for p in page.points} == {64}


def test_the_estimate_learns_from_measured_points():
    from attn_explorer.session.cost_sweep import estimate_seconds

    settings = dict(ns=[1024], impls=["naive"], heads=2, d_k=32, repeats=3, device="cpu", time_budget_s=None)
    prior = estimate_seconds([], settings, 1024)
    assert prior > 0
    measured = [dict(n=512, impl="naive", status="ok", ms=10.0, ms_runs=[10.0, 10.0, 10.0], seconds=0.05)]
    # 4× the work at twice n: 4 × (20 ms warm-up + 3 × 10 ms)
    assert estimate_seconds(measured, settings, 1024) == pytest.approx(4 * (0.02 + 0.03))
    assert estimate_seconds(measured, settings, 2048) > estimate_seconds(measured, settings, 1024)


def _plain(label: QLabel) -> str:
    """What a rich-text label really shows."""
    from PySide6.QtGui import QTextDocument

    doc = QTextDocument()
    doc.setHtml(label.text())
    return doc.toPlainText().strip()


@pytest.mark.parametrize("size", [PAGE_AT_1024x700, PAGE_AT_1920x1080])
def test_one_n_draws_short_bars_and_a_whole_legend(qtbot, page, size):
    page.resize(*size)
    page.repeats_spin.setValue(3)
    page.n_values = [256]
    assert run(qtbot, page) == "done"
    qtbot.wait(50)  # let the layout settle at this size
    for plot in (page.plots.time_plot, page.plots.memory_plot):
        (x0, x1), (y0, y1) = plot.getViewBox().viewRange()
        assert x0 < 2.408 < x1 and x1 - x0 >= 0.5 and y1 - y0 >= 0.5  # log10 units: not a sliver around one n
        assert "x0.0" not in plot.getAxis("left").labelString()  # no SI factor on the custom ticks
    x0, x1 = page.plots.time_plot.getViewBox().viewRange()[0]
    for name, bars in page.plots.error_bars.items():
        assert bars.opts["beam"] <= 0.05 * (x1 - x0), name  # a cap, not a line across the plot
    for name, cells in page.plots.legend_cells.items():
        shown = [_plain(c) for c in cells]
        assert shown[1] == shown[2] == "– (one n)", shown  # one n has no slope, and says so in full
        assert shown == page.plots.legend_row(name)
        for cell in cells:
            assert cell.isVisible() and cell.width() >= cell.sizeHint().width(), (name, shown)
            right = cell.mapTo(page, QPoint(cell.width(), 0)).x()
            assert right <= page.width(), (name, shown)
    assert clipped(page) == []


def test_building_the_page_does_not_load_torch():
    code = ("import os, sys; os.environ['QT_QPA_PLATFORM'] = 'offscreen'\n"
            "from PySide6.QtWidgets import QApplication; app = QApplication([])\n"
            "from attn_explorer.gui.cost.page import CostPage; p = CostPage()\n"
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_a_missing_device_is_one_line_in_the_status(qtbot, page):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    page.device_box.setCurrentText("cuda")
    page.n_values = [64]
    outcome = run(qtbot, page)
    assert outcome.startswith("failed: device 'cuda' was asked for but no CUDA GPU is available")
    assert page.status_label.text() == outcome
    assert page.points == [] and page.run_button.isEnabled()


# --- the model's own q, k, v -----------------------------------------------------------------------


@pytest.fixture
def model_page(qtbot):
    from attn_explorer.session.state import SessionState
    from tests.gui.conftest import cached_loader

    state = SessionState(loader=cached_loader, device="cpu")
    p = CostPage(state)
    qtbot.addWidget(p)
    p.show()
    assert not p.qkv_panel.button.isEnabled() and "Load a model" in p.qkv_panel.caption.text()
    errors = []
    state.error_raised.connect(errors.append)
    state.load_model("minilm")
    qtbot.waitUntil(lambda: state.result is not None or bool(errors), timeout=SWEEP_TIMEOUT_MS)
    assert errors == []
    yield p, state
    p.shutdown()
    state.shutdown()


def test_the_variants_on_the_models_own_qkv(qtbot, model_page):
    page, state = model_page
    panel = page.qkv_panel
    with qtbot.waitSignal(state.attention_ready, timeout=SWEEP_TIMEOUT_MS):
        state.set_text("The animal didn't cross the street because it was too tired. " * 4)
    page.window_spin.setValue(8)
    assert panel.button.isEnabled() and "minilm, layer 0, this input, 58 tokens" in panel.caption.text()
    with qtbot.waitSignal(page.sweep.qkv_measured, timeout=SWEEP_TIMEOUT_MS):
        qtbot.mouseClick(panel.button, Qt.LeftButton)
    rows = {panel.table.item(r, 0).text(): [panel.table.item(r, c).text() for c in range(1, 4)]
            for r in range(panel.table.rowCount())}
    assert set(rows) == set(ALL)
    assert rows["naive"][:2] == ["reference", "reference"]
    assert float(rows["window"][0]) < float(rows["window"][1]) / 2  # far closer on the model's q, k, v
    assert "(layer 0, this input)" in panel.title.text() and "window w = 8" in panel.caption.text()

    # another layer: the table described layer 0, so it goes
    with qtbot.waitSignal(page.sweep.qkv_cleared, timeout=5000):
        state.select(layer=1)
    assert panel.table.rowCount() == 0 and "layer 1" in panel.caption.text()


# --- layout ----------------------------------------------------------------------------------------


def clipped(page: CostPage) -> list[str]:
    """Widgets on the page that are cut off: narrower than they need, taller text than room, or outside."""
    bad = []
    need = page.minimumSizeHint()
    if need.width() > page.width() or need.height() > page.height():  # the window would have to grow
        bad.append(f"the page needs {need.width()}×{need.height()} px, has {page.width()}×{page.height()}")
    plots = page.plots.time_plot
    plots_bottom = plots.mapTo(page, QPoint(0, plots.height())).y()
    for label in page.plots.legend.findChildren(QLabel) + [page.plots.fit_note]:
        if label.isVisible() and label.mapTo(page, QPoint(0, 0)).y() < plots_bottom:
            bad.append(f"{label.text()[:30]!r} lies under the plots")
    widgets = [page.live_box, page.run_button, page.cancel_button, page.readout, page.n_label, page.eta_label,
               page.plots.fit_note, page.plots.noise_label, *page.variant_boxes.values(),
               *(cell for cells in page.plots.legend_cells.values() for cell in cells)]
    for w in widgets:
        if w.isHidden():
            continue
        top_left, bottom_right = w.mapTo(page, QPoint(0, 0)), w.mapTo(page, QPoint(w.width(), w.height()))
        if top_left.x() < 0 or bottom_right.x() > page.width() or bottom_right.y() > page.height():
            bad.append(f"{w.objectName() or type(w).__name__} {w.text()[:30] if hasattr(w, 'text') else ''}: outside")
        if w.height() < min(w.minimumSizeHint().height(), w.sizeHint().height()):
            bad.append(f"{type(w).__name__} {getattr(w, 'text', lambda: '')()[:30]!r}: squashed to {w.height()} px")
        if isinstance(w, QLabel) and w.wordWrap() and w.text() and w.heightForWidth(w.width()) > w.height():
            bad.append(f"label {w.text()[:30]!r}: {w.heightForWidth(w.width())} px of text in {w.height()}")
        elif not (isinstance(w, QLabel) and w.wordWrap()) and w.width() < w.minimumSizeHint().width():
            bad.append(f"{type(w).__name__} {getattr(w, 'text', lambda: '')()[:30]!r}: {w.width()} < "
                       f"{w.minimumSizeHint().width()} px")
    return bad


@pytest.mark.parametrize("size", [PAGE_AT_1024x700, PAGE_AT_1920x1080])
def test_nothing_is_clipped_before_and_after_a_sweep(qtbot, page, size, monkeypatch):
    from attn_explorer.cost import measure

    page.resize(*size)
    qtbot.wait(50)
    assert (page.width(), page.height()) == size
    assert clipped(page) == []
    # fill every row of the legend and raise the noise warning: the fullest the page gets
    monkeypatch.setattr(measure, "timed_call", jittery())
    page.repeats_spin.setValue(3)
    page.n_values = [64, 128, 256]
    assert run(qtbot, page) == "done"
    assert not page.plots.noise_label.isHidden()
    qtbot.wait(50)
    assert (page.width(), page.height()) == size
    assert clipped(page) == []


def test_a_point_measured_beside_other_work_says_so_in_its_row(page):
    rec = {"n": 256, "impl": "chunked", "status": "ok", "ms": 1.5, "ms_min": 1.4, "ms_max": 2.0, "peak_bytes": None,
           "rel_error": None, "reference": None, "beside": {"model-run": 0.012}}
    page.table.put(rec)
    note = page.table.item(page.table.rowCount() - 1, len(page.table.HEADERS) - 1)
    assert note.text() == "measured beside other work: model-run 12.0 ms"
    page.table.put({**rec, "beside": {}})  # measured again, alone: the note goes
    assert page.table.item(page.table.rowCount() - 1, len(page.table.HEADERS) - 1).text() == ""
