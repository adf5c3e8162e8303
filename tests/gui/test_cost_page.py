"""The Cost page: a short sweep streams points onto the plots, Cancel stops it, failures stay local."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from attn_explorer.core import efficient  # noqa: E402
from attn_explorer.gui.cost_page import N_MIN, CostPage  # noqa: E402

SWEEP_TIMEOUT_MS = 60000


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
    assert {(p["n"], p["impl"]) for p in page.points} == {(n, v) for n in (64, 128, 256, 512)
                                                          for v in ("naive", "chunked", "window", "linear", "sdpa")}
    assert all(p["status"] == "ok" for p in page.points)
    for name, (t_curve, m_curve) in page.curves.items():
        assert list(t_curve.xData) == [64, 128, 256, 512], name
        assert len(m_curve.yData) == 4, name
    assert page.table.rowCount() == 20
    legend = [label.text for _, label in page.memory_plot.plotItem.legend.items]
    assert any(text.startswith("naive  p = 2.0") for text in legend), legend
    fits = page.slopes()
    assert fits["naive"]["memory"] == pytest.approx(2.0, abs=0.05)
    assert fits["window"]["memory"] == pytest.approx(1.0, abs=0.05)
    # the approximations show their error next to their speed
    time_legend = [label.text for _, label in page.time_plot.plotItem.legend.items]
    assert any(t.startswith("linear") and "error" in t for t in time_legend), time_legend
    assert page.run_button.isEnabled() and not page.cancel_button.isEnabled()
    assert page.progress_bar.value() == page.progress_bar.maximum()


def test_cancel_stops_the_sweep(qtbot, page):
    for name, box in page.variant_boxes.items():
        box.setChecked(name == "chunked")
    page.heads_spin.setValue(4)
    page.n_values = [1024, 2048, 4096, 8192, 16384, 32768]
    page.repeats_spin.setValue(3)
    with qtbot.waitSignal(page.point_measured, timeout=SWEEP_TIMEOUT_MS):
        qtbot.mouseClick(page.run_button, Qt.LeftButton)
    assert page.cancel_button.isEnabled() and not page.run_button.isEnabled()
    # the point is on the plot while the sweep is still running
    qtbot.waitUntil(lambda: page.curves["chunked"][0].xData is not None and len(page.curves["chunked"][0].xData) >= 1)
    assert page.is_running
    with qtbot.waitSignal(page.sweep_finished, timeout=SWEEP_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(page.cancel_button, Qt.LeftButton)
    assert blocker.args == ["cancelled"]
    kept = len(page.points)
    assert 1 <= kept < 6
    qtbot.wait(300)
    assert len(page.points) == kept  # nothing arrives after the end
    assert page.run_button.isEnabled() and not page.cancel_button.isEnabled()
    assert "cancelled" in page.status_label.text()


def test_a_failing_variant_marks_its_points_and_keeps_the_rest(qtbot, page, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: not enough memory")

    monkeypatch.setitem(efficient.VARIANTS, "linear", out_of_memory)
    page.n_values = [64, 128]
    assert run(qtbot, page) == "done"
    status = {(p["n"], p["impl"]): p["status"] for p in page.points}
    assert status[64, "linear"] == status[128, "linear"] == "failed"
    assert [s for (n, impl), s in status.items() if impl != "linear"] == ["ok"] * 8
    notes = [page.table.item(r, 5).text() for r in range(page.table.rowCount())
             if page.table.item(r, 1).text() == "linear"]
    assert notes == ["failed: RuntimeError: DefaultCPUAllocator: not enough memory"] * 2
    assert page.curves["linear"][0].xData is None or len(page.curves["linear"][0].xData) == 0


def test_oversized_points_are_skipped_and_marked(qtbot, page):
    page.budget_override = 3_000_000
    page.n_values = [64, 1024]
    assert run(qtbot, page) == "done"
    naive_1024 = next(p for p in page.points if (p["n"], p["impl"]) == (1024, "naive"))
    assert naive_1024["status"] == "skipped" and naive_1024["message"].startswith("skipped: would need")
    assert 1024 in list(page.not_run.xData)


def test_slider_steps_double_n_and_the_readout_gives_the_matrix_bytes(qtbot, page):
    page.heads_spin.setValue(12)
    page.n_slider.setValue(0)
    assert page.current_n == N_MIN
    page.n_slider.setValue(4)
    assert page.current_n == 1024
    assert page.n_values == [64, 128, 256, 512, 1024]
    assert "50.3 MB" in page.readout.text()  # 12 heads × 1024² × 4 bytes
    assert page.n_markers[0].value() == pytest.approx(3.0103, abs=1e-3)  # log10(1024)
    top_all = page.n_slider.maximum()
    for name, box in page.variant_boxes.items():
        box.setChecked(name == "naive")
    assert page.n_slider.maximum() < top_all  # the n×n matrix runs out of budget first


def test_releasing_the_slider_measures_that_n(qtbot, page):
    for name, box in page.variant_boxes.items():
        box.setChecked(name in ("chunked", "linear"))
    page.n_slider.setValue(2)
    with qtbot.waitSignal(page.sweep_finished, timeout=SWEEP_TIMEOUT_MS):
        page.n_slider.sliderReleased.emit()
    assert sorted((p["n"], p["impl"]) for p in page.points) == [(256, "chunked"), (256, "linear")]


def test_building_the_page_does_not_load_torch():
    code = ("import os, sys; os.environ['QT_QPA_PLATFORM'] = 'offscreen'\n"
            "from PySide6.QtWidgets import QApplication; app = QApplication([])\n"
            "from attn_explorer.gui.cost_page import CostPage; p = CostPage()\n"
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
