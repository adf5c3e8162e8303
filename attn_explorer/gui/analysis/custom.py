"""The *Yours* page: your own analyses (`ax.register_analysis(name, fn)`), one at a time from a chooser.

The registry is read and the chosen function runs in a worker (session.custom), on the session's current
result; only its checked NumPy answer comes back. It is drawn from its view: an (L, H) answer as a layer ×
head grid (click a cell to open that head), an (N,) answer as a strip under the tokens, an (N, N) one (or an
image run's patch grid) as a map. A function that fails, or answers with the wrong shape, is one line in the
window's banner, and the last answer that worked stays on screen.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QComboBox, QLabel, QPushButton

from attn_explorer.gui.analysis.common import DIVERGING, AnalysisPage, HeatPanel, cell_plot, label_cells, peak
from attn_explorer.gui.widgets.heatmap import cell_centre, cell_under, colormap, set_bar_label
from attn_explorer.session.custom import HOW_TO_REGISTER, custom_analysis_job
from attn_explorer.session.state import SessionState

LANE = "analysis-custom"
STRIP_HEIGHT = 260  # px: a per-token answer is one row, drawn as a strip this tall (title, row, token labels)
WHAT = {"grid": "one number per head (layer down, head across)", "tokens": "one number per token",
        "map": "a token × token map"}


class CustomAnalysisPage(AnalysisPage):
    def __init__(self, state: SessionState, parent=None):
        super().__init__(state, parent)
        self.unused_note("your function gets the whole run", log="the colours run from the answer's smallest "
                         "to its largest value")
        self.chooser = QComboBox()
        self.chooser.setMinimumContentsLength(16)
        self.chooser.setToolTip("The analyses registered with ax.register_analysis or installed as "
                                "attn_explorer.analyses entry points")
        self.view_label = QLabel("")
        self.again = QPushButton("Run again")
        self.again.setToolTip("Read the registered analyses again and run the chosen one (after you registered "
                              "or changed one while the window was open)")
        bar = self.control_row
        for w in (QLabel("analysis"), self.chooser, self.again, self.view_label):
            bar.addWidget(w)
        bar.addStretch(1)
        self.answer = None  # the last answer drawn (an AnalysisAnswer: plain data)
        self.kind: str | None = None  # which drawing the canvas holds now: "grid" or "panel"
        self.plot: pg.PlotItem | None = None  # grid: the L×H cells
        self.image: pg.ImageItem | None = None
        self.bar: pg.ColorBarItem | None = None
        self.panel: HeatPanel | None = None  # tokens and map
        self.shown_problems: tuple[str, ...] = ()  # entry point problems already said in the banner
        self.asked = None  # (result, name) of the job in flight
        self.chooser.currentIndexChanged.connect(lambda *_: self.refresh())
        self.again.clicked.connect(self.run_again)
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        state.attention_ready.connect(self.refresh)
        state.options_changed.connect(self.refresh)

    def chosen(self) -> str | None:
        name = self.chooser.currentData()
        return None if name is None else str(name)

    def run_again(self) -> None:
        """Read the registry again and run the chosen analysis on the current result."""
        self.asked = self._drawn_for = None
        self.refresh()

    def showEvent(self, ev):  # noqa: N802 - Qt API
        super().showEvent(ev)
        if self.answer is None and self.asked is None and self.state.result is not None:
            self.run_again()  # nothing drawn yet (none was registered, or it failed): look again when shown

    # ------------------------------------------------------------------------------- compute
    def refresh(self, *_):
        r = self.result_to_draw()
        if r is None:
            return
        name = self.chosen()
        if self.answer is not None and self._drawn_for == (r, name):
            self._draw()  # the same answer (a colormap or option changed)
            return
        if self.asked == (r, name):
            return  # already on its way
        self.asked = (r, name)
        if self.answer is None:
            self.stack.show_message("Running your analysis…")
        self.state.submit(custom_analysis_job, name, r, key=LANE, uses_model=False,
                          on_result=lambda rep: self._arrived(r, rep), on_error=self._job_failed)

    _drawn_for: tuple | None = None

    def _arrived(self, r, report) -> None:
        if r is not self.state.result:
            return  # a newer result is on its way and will be run
        self.asked = None
        self._fill_chooser(report.names)
        fresh = tuple(p for p in report.problems if p not in self.shown_problems)
        if fresh:
            self.shown_problems += fresh
            self.state.error_raised.emit(fresh[0] + (f" (and {len(fresh) - 1} more)" if len(fresh) > 1 else ""))
        if not report.names:
            self.answer, self._drawn_for = None, None
            self.caption.setText("")
            self.view_label.setText("")
            self.stack.show_message(HOW_TO_REGISTER)
            return
        if report.error:
            self.state.error_raised.emit(report.error)
            if self.answer is None:
                self.stack.show_message("This analysis could not be drawn: the message at the top of the window "
                                        "says why.")
            else:
                self._drawn_for = None  # the view on screen is an older answer: run again when asked
                self.caption.setText(self.caption.text().split("<br>")[0]
                                     + "<br><i>This is the last answer that worked; the newest failed (see the "
                                       "message at the top).</i>")
            return
        self.answer, self._drawn_for = report.answer, (r, report.answer.name)
        self._draw()

    def _job_failed(self, message: str) -> None:
        self.asked = None
        self.state.error_raised.emit(message)  # the last good view stays

    def _fill_chooser(self, names) -> None:
        want = self.chosen()
        have = [self.chooser.itemData(i) for i in range(self.chooser.count())]
        if have == [n for n, _ in names]:
            return
        self.chooser.blockSignals(True)
        self.chooser.clear()
        for n, view in names:
            self.chooser.addItem(n + (f"  ({view})" if view else ""), n)
        i = self.chooser.findData(want) if want is not None else -1
        self.chooser.setCurrentIndex(max(i, 0))
        self.chooser.blockSignals(False)
        self.chooser.setEnabled(bool(names))

    # ------------------------------------------------------------------------------- drawing
    def _levels(self, v: np.ndarray) -> tuple[tuple[float, float], str]:
        lo = float(v.min()) if v.size else 0.0
        if lo < 0:
            top = max(abs(lo), abs(float(v.max())), 1e-12)
            return (-top, top), DIVERGING
        return (0.0, peak(v)), self.state.colormap

    def _canvas_for(self, kind: str) -> None:
        """The canvas holds the drawing `kind` needs ("grid" or "panel"), built once per change of kind."""
        if self.kind == kind:
            return
        self.canvas.clear()
        self.plot = self.image = self.bar = self.panel = None
        if kind == "grid":
            self.plot = cell_plot(self.canvas, 0, 0)
            self.plot.setLabel("left", "layer")
            self.plot.setLabel("bottom", "head")
            self.image = pg.ImageItem(axisOrder="row-major")
            self.plot.addItem(self.image)
            self.bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), interactive=False, width=12)
            self.bar.setImageItem(self.image, insert_in=self.plot)
            self.bar.axis.enableAutoSIPrefix(False)
        else:
            self.panel = HeatPanel(self.canvas, 0, 0, self.state.colormap, "")
        self.kind = kind

    def _draw(self) -> None:
        a = self.answer
        v = np.asarray(a.values, dtype=np.float32)
        levels, cmap = self._levels(v)
        self.stack.show_canvas()
        if a.view == "grid":
            self._canvas_for("grid")
            L, H = v.shape
            self.image.setImage(v, levels=levels, autoLevels=False)
            self.image.setRect(QRectF(0, 0, H, L))
            self.bar.setColorMap(colormap(cmap))
            self.bar.setLevels(values=levels)
            set_bar_label(self.bar, a.name)
            self.plot.setTitle(a.name, size="10pt")
            self.plot.setRange(xRange=(0, H), yRange=(0, L), padding=0.02)
            label_cells(self.plot, L, H)
            hint = "Hover a cell for its value; click it to open that head."
        else:
            self._canvas_for("panel")
            strip = a.view == "tokens"
            m = v[None, :] if strip else v
            self.panel.show(m, [a.name] if strip else a.rows, a.cols, levels, cmap, title=a.name, label=a.name)
            self.panel.plot.setLabel("left", "" if strip else "patch row" if a.rows[:1] == ["r0"] else "row")
            self.panel.plot.setLabel("bottom", "token" if strip or a.rows[:1] != ["r0"] else "patch column")
            self.canvas.ci.layout.setRowMaximumHeight(0, STRIP_HEIGHT if strip else 1e6)
            hint = "Hover a cell for its value."
        shape = " × ".join(str(s) for s in v.shape)
        self.view_label.setText(f"view: {a.view} ({shape})")
        r = self.state.result
        signed = " Negative values: blue, positive: red, 0 white." if cmap == DIVERGING else ""
        self.caption.setText(f"<b>{a.name}</b> — your analysis, {WHAT[a.view]}, run on this input "
                             f"({r.num_tokens if r is not None else len(a.cols)} tokens). Colour from "
                             f"{levels[0]:.3g} to {levels[1]:.3g}.{signed}")
        self.readout.setText(hint)

    # ------------------------------------------------------------------------------- input
    def cell_at(self, scene_pos) -> tuple[int, int] | None:
        """(row, col) of the answer under a scene position (a strip's row is 0), or None."""
        a = self.answer
        if a is None:
            return None
        if self.kind == "grid" and self.plot is not None:
            return cell_under(self.plot, scene_pos, a.values.shape)
        if self.panel is not None:
            shape = (1, a.values.shape[0]) if a.view == "tokens" else a.values.shape
            return cell_under(self.panel.plot, scene_pos, shape)
        return None

    def cell_center(self, i: int, j: int):
        """Scene position of cell (i, j)'s centre (tests hover and click here)."""
        return cell_centre(self.plot if self.kind == "grid" else self.panel.plot, i, j)

    def describe(self, i: int, j: int) -> str:
        a = self.answer
        if a.view == "grid":
            return f"L{i} H{j}: {a.name} = {float(a.values[i, j]):.4g}"
        if a.view == "tokens":
            return f'token {j} "{a.cols[j]}": {a.name} = {float(a.values[j]):.4g}'
        return f'"{a.rows[i]}" → "{a.cols[j]}": {a.name} = {float(a.values[i, j]):.4g}'

    def _hovered(self, pos) -> None:
        hit = self.cell_at(pos)
        if hit is not None:
            self.readout.setText(self.describe(*hit))

    def _clicked(self, ev) -> None:
        hit = self.cell_at(ev.scenePos())
        if hit is not None and self.answer is not None and self.answer.view == "grid":
            self.open_head(*hit)
