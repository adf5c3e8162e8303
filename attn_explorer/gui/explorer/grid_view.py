"""The grid page: every head of every layer as L×H small heatmaps, drawn as one mosaic image.

One ImageItem for all heads (72 separate items cost ~18 ms a repaint; one mosaic ~4 ms). The mosaic
arrives ready to draw (`state.grid_image`): the worker that ran the model also max-pooled heads wider
than 128 pixels, so a sharp peak stays visible, and tiled them; the GUI thread only sets the image.
The head page shows every pixel. Clicking a cell selects that head and emits `head_opened`.

A long input's run keeps no maps (RunResult.is_lazy) and comes without a mosaic: the page asks its lane
for one (session.long_view.overview_job), which fills it in head by head from q and k, with a progress bar
and Stop; heads still to come are blank.

The plot's coordinates are cells, not pixels: head h of layer l is the unit square at (h, l) whatever
n is. So axes, separators and range depend only on (L, H) and are not laid out again while typing
changes n (that relayout cost more than the new image itself).
"""
from __future__ import annotations

import html
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, QTimer, Signal
from PySide6.QtGui import QPen, QColor
from PySide6.QtWidgets import QGraphicsRectItem, QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from attn_explorer.gui.widgets.heatmap import (CanvasStack, LazyPage, PaintedGraphicsWidget, add_heat_image, follow_loading,
                                       style_colorbar, waiting_for_input)
from attn_explorer.gui.explorer.controls import StackSwitch, titled_page
from attn_explorer.gui.explorer.long_map import PREVIOUS  # the mark on maps of the input before an edit (issue 24)
from attn_explorer.session.live_run import incomplete
from attn_explorer.session.long_view import GRID_LANE, overview_job, result_tag, reused_prefix
from attn_explorer.gui.explorer.mixer_marks import MixerOverlay, grid_note
from attn_explorer.session.stacks import STACK_NAMES, short_kind, stack_maps
from attn_explorer.session.state import SessionState



class HeadGridView(LazyPage, QWidget):
    """L×H attention maps with layer and head labels and one shared colour bar."""

    head_opened = Signal(int, int)  # layer, head: the user clicked a cell

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self._shape = (0, 0)
        self._kinds: tuple[str, ...] = ()  # the row labels' layer kinds ("local, window 512" / "global")
        self._coming: str | None = None  # the model being loaded, while it loads
        self.last_image: np.ndarray | None = None

        self.title = QLabel("Load a model to see its attention.")
        self.title.setWordWrap(True)
        self.canvas = PaintedGraphicsWidget()
        self.stack = CanvasStack(self.canvas)
        self.placeholder = self.stack.placeholder
        self.plot = self.canvas.addPlot()
        self.plot.invertY(True)
        self.plot.setAspectLocked(True)  # every head's map stays square, as the n×n matrix is
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.showAxis("top")
        self.plot.getAxis("bottom").setStyle(showValues=False)
        self.plot.getAxis("bottom").setTicks([[], []])
        self.plot.setLabel("left", "layer")
        self.plot.setLabel("top", "head")
        self.image, self.colorbar = add_heat_image(self.plot, state.colormap)
        self.mixers = MixerOverlay(self.plot)  # a hybrid's recurrent rows (signed) and absent heads (issue 25)
        # thin lines between cells, drawn once per shape instead of into the image
        self.separators = pg.PlotCurveItem(connect="pairs", pen=pg.mkPen("w", width=2))
        self.plot.addItem(self.separators)
        self.highlight = QGraphicsRectItem()
        pen = QPen(QColor("#ff3b30"))
        pen.setWidth(2)
        pen.setCosmetic(True)
        self.highlight.setPen(pen)
        self.plot.addItem(self.highlight)
        self.highlight.hide()

        self.stack_switch = StackSwitch(state)
        # long inputs: the mosaic fills in head by head from q and k, in its lane, with progress
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.fill_button = QPushButton("Stop")
        self.fill_button.setToolTip("Stop filling in the overview (the heads done stay), or fill it in again")
        self.filling = QWidget()
        row = QHBoxLayout(self.filling)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.progress, 1)
        row.addWidget(self.fill_button)
        self.filling.hide()
        self._overview: tuple | None = None  # (run tag, GridImage so far, heads done, heads in all)
        self._filling_tag: int | None = None  # the run whose overview is being filled in
        self._complete: tuple | None = None  # (GridImage, n, tokens, model, dk) of the last overview filled in
        lay = titled_page(self, self.title, self.stack_switch)
        lay.addWidget(self.filling)
        lay.addWidget(self.stack, 1)
        self.fill_button.clicked.connect(self._fill_clicked)

        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        self._fit_timer = QTimer(self)
        self._fit_timer.setSingleShot(True)
        self._fit_timer.setInterval(0)
        self._fit_timer.timeout.connect(self._fit_view)
        self.plot.vb.sigResized.connect(self._fit_timer.start)
        state.attention_ready.connect(lambda *_: self.stack.show_canvas())
        state.attention_ready.connect(self.show_result)
        state.model_loading.connect(self._loading)
        follow_loading(state, self.stack.show_message)
        state.selection_changed.connect(self._move_highlight)
        state.options_changed.connect(self._options)
        state.model_loaded.connect(lambda info: self._load_ended())
        state.error_raised.connect(lambda *_: self._load_ended())
        state.busy_changed.connect(lambda *_: self._set_title())  # "running …" only while it runs
        state.run_progressed.connect(lambda *_: self._set_title())  # layer k of L, while the maps are the old ones
        state.input_cleared.connect(self._cleared)

    # --------------------------------------------------------------------------------- drawing
    def redraw(self) -> None:
        self.show_result(self.state.result)

    def show_result(self, r, grid=None) -> None:
        """Draw `grid` (an api.display.GridImage; the session's `grid_image` of `r` when not given)."""
        if not self.needs_draw():
            return
        grid = grid if grid is not None else self.state.grid_image
        if r is not None and getattr(r, "is_lazy", False):
            if grid is not None and grid is getattr(r, "display", None):  # filled in as the run went (live_run)
                self._stop_filling(hide=True)
                if not incomplete(r):  # whole: what an edit that reuses the prefix starts from
                    self._complete = (grid, r.num_tokens, list(r.tokens), r.model, float(r.dk_scale))
            grid = grid if grid is not None else self._lazy_grid(r)
        else:
            self._stop_filling(hide=True)
        if r is None or grid is None:
            return
        L, H = grid.layers, grid.heads
        values, levels = grid.values(self.state.log_scale)
        self.last_image = values
        self.image.setImage(values, levels=levels, autoLevels=False)
        self.image.setRect(QRectF(0, 0, H, L))
        info = self.state.info if self.state.info is not None and self.state.info.name == r.model else None
        self.mixers.paint(stack_maps(r, grid.stack).attentions, info, grid, grid.stack == "encoder", r.special)
        kinds = self.state.layer_kinds() if grid.stack == "encoder" else ()
        kinds = kinds if len(kinds) == L else ()
        if (L, H) != self._shape or kinds != self._kinds:
            self._shape, self._kinds = (L, H), kinds
            self._layout_axes(L, H)
        self._move_highlight(self.state.layer, self.state.head)
        self._set_title(r)

    # --------------------------------------------------------------------------------- long inputs
    def _lazy_grid(self, r):
        """A long input's mosaic: what has been filled in so far (None before the first heads), asking the grid
        lane to fill it in when it is not already doing so for this run."""
        tag = result_tag(r)
        ov = self._overview
        if ov is not None and ov[0] == tag:
            return ov[1]
        if self._filling_tag != tag:
            self._start_filling(r)
        return None

    def _start_filling(self, r) -> None:
        tag = result_tag(r)
        self._filling_tag = tag
        self._overview = None
        self.last_image = None
        L, H = r.attentions.shape[:2]
        self.progress.setRange(0, L * H)
        self.progress.setValue(0)
        self.progress.setFormat(f"filling in every head from q and k: 0 of {L * H}")
        self.fill_button.setText("Stop")
        self.filling.show()
        # an edit that reused the prefix: the cells above it come from the last complete overview (issue 24)
        previous = self._previous_overview(r)
        self.state.submit(overview_job, r, 128, "encoder", previous, key=GRID_LANE, uses_model=False,
                          on_yield=lambda part: self._filled(tag, part), on_result=lambda _: self._fill_ended(tag),
                          on_error=lambda msg: self._fill_failed(tag, msg))

    def _previous_overview(self, r) -> tuple | None:
        """(GridImage, tokens) of the last complete overview when r reused a prefix that overview's run shares
        (same model, d_k and first p tokens: a causal model's rows before p are then the same), else None."""
        p, done = reused_prefix(r), self._complete
        if p <= 0 or done is None:
            return None
        grid, n, tokens, model, dk = done
        same = model == r.model and dk == float(r.dk_scale) and tokens[:p] == list(r.tokens[:p])
        return (grid, n) if same else None

    def _filled(self, tag: int, part) -> None:
        """A part of the overview arrived: draw it if it is still the run on screen."""
        r = self.state.result
        if r is None or result_tag(r) != tag:
            return
        done, total, grid = part
        self._overview = (tag, grid, done, total)
        self.progress.setValue(done)
        self.progress.setFormat(f"filling in every head from q and k: {done} of {total}")
        if done >= total:
            self.filling.hide()
            self._filling_tag = None
            self._complete = (grid, r.num_tokens, list(r.tokens), r.model, float(r.dk_scale))
        self.show_result(r, grid)

    def _fill_ended(self, tag: int) -> None:
        if self._filling_tag == tag:
            self._filling_tag = None
        ov = self._overview
        if ov is not None and ov[0] == tag and ov[2] >= ov[3]:
            self.filling.hide()

    def _fill_failed(self, tag: int, message: str) -> None:
        if self._filling_tag == tag:
            self._filling_tag = None
            self.progress.setFormat("the overview could not be filled in")
            self.fill_button.setText("Fill in again")
        self.state.error_raised.emit(message)

    def _stop_filling(self, hide: bool = False) -> None:
        if self._filling_tag is not None:
            self.state.cancel(GRID_LANE)
            self._filling_tag = None
        if hide:
            self.filling.hide()

    def _fill_clicked(self) -> None:
        r = self.state.result
        if self._filling_tag is not None:  # stop: the heads done stay, the rest stay blank
            self._stop_filling()
            ov = self._overview
            done, total = (ov[2], ov[3]) if ov is not None else (0, self.progress.maximum())
            self.progress.setFormat(f"stopped: {done} of {total} heads filled in, the rest are blank")
            self.fill_button.setText("Fill in again")
            self._set_title()
        elif r is not None and getattr(r, "is_lazy", False):
            self._start_filling(r)

    def overview_state(self) -> str:
        """"", or how far a long input's overview is: "12 of 72 heads" (the title says it too)."""
        r = self.state.result
        ov = self._overview
        if r is None or not getattr(r, "is_lazy", False):
            return ""
        if getattr(r, "display", None) is not None:  # filled in layer by layer as it ran (issue 24 C)
            return incomplete(r)
        if ov is None or ov[0] != result_tag(r):
            return "no head filled in yet"
        done, total = ov[2], ov[3]
        if done >= total:
            return ""
        return f"{done} of {total} heads filled in" + ("" if self._filling_tag is not None else " (stopped)")

    def _layout_axes(self, L: int, H: int) -> None:
        """Ticks, separators and range for L × H cells of one unit each."""
        self._tick_steps = (0, 0)
        self._set_ticks(1, 1)
        xs, ys = [], []
        for l in range(1, L):
            xs += [0, H]
            ys += [l, l]
        for h in range(1, H):
            xs += [h, h]
            ys += [0, L]
        self.separators.setData(np.array(xs, float), np.array(ys, float))
        self.plot.setRange(xRange=(0, H), yRange=(0, L), padding=0.01)
        self._fit_timer.start()

    def _set_ticks(self, layer_step: int, head_step: int) -> None:
        """Label every layer and head, or every k-th when the cells are narrower than their labels."""
        if (layer_step, head_step) == getattr(self, "_tick_steps", (0, 0)):
            return
        self._tick_steps = (layer_step, head_step)
        L, H = self._shape
        self.plot.getAxis("left").setTicks([[(l + 0.5, self.row_label(l)) for l in range(0, L, layer_step)], []])
        self.plot.getAxis("top").setTicks([[(h + 0.5, f"H{h}") for h in range(0, H, head_step)], []])

    def row_label(self, layer: int) -> str:
        """"L5", or "L5 · local 512" / "L5 · global" for a model that mixes local and global layers."""
        if layer < len(self._kinds):
            return f"L{layer} · {short_kind(self._kinds[layer])}"
        return f"L{layer}"

    def _fit_view(self) -> None:
        """Shrink the plot (by layout margins) until its view box has the mosaic's shape, so the axes hug
        the square tiles instead of framing empty space (the aspect lock alone pads the view)."""
        L, H = self._shape
        if not L or not H:
            return
        lay = self.canvas.ci.layout
        ml, mt, mr, mb = lay.getContentsMargins()
        vb = self.plot.vb.size()
        total_w, total_h = vb.width() + ml + mr, vb.height() + mt + mb
        if total_w <= 0 or total_h <= 0:
            return
        want = H / L  # width / height of the mosaic in cells
        if total_w / total_h > want:
            side, top = (total_w - total_h * want) / 2, 0.0
        else:
            side, top = 0.0, (total_h - total_w / want) / 2
        if abs(side - ml) > 1 or abs(top - mt) > 1:
            lay.setContentsMargins(side, top, side, top)
        # cells this small cannot carry a label each: thin the labels out (the separators stay)
        fm = self.fontMetrics()
        cell_w = (total_w - 2 * side) / H if H else 0
        cell_h = (total_h - 2 * top) / L if L else 0
        head_step = max(1, math.ceil((fm.horizontalAdvance(f"H{H - 1}") + 6) / max(cell_w, 1e-6)))
        layer_step = max(1, math.ceil((fm.height() + 1) / max(cell_h, 1e-6)))
        self._set_ticks(layer_step, head_step)

    def _move_highlight(self, layer: int, head: int) -> None:
        if self._shape == (0, 0):
            return
        self.highlight.setRect(QRectF(head, layer, 1, 1))
        self.highlight.show()

    def _loading(self, src: str) -> None:
        self._coming = src
        self._set_title()

    def _load_ended(self) -> None:
        self._coming = None
        self._set_title()

    def _cleared(self) -> None:
        """The input was emptied: the mosaic goes with it (the placeholder says what to do)."""
        self._stop_filling(hide=True)
        self._overview = None
        self.last_image = None
        self._set_title()

    def _options(self) -> None:
        style_colorbar(self.colorbar, self.state.colormap, self.state.log_scale)
        if self.state.result is not None:
            self.show_result(self.state.result)

    def _set_title(self, r=None) -> None:
        """Describe the grid that is drawn: its model, shape and length come from the result on screen,
        so while another model loads the header still matches the old maps (and says what is coming)."""
        st = self.state
        info, r = st.info, r or st.result
        same = info is not None and r is not None and info.name == r.model
        # a long run's layers as they came, stopped by a switch: still marked while another model loads and runs
        kept = f" — <b>{incomplete(r)}</b> (stopped)" if r is not None and incomplete(r) else ""
        if self._coming is not None:
            coming = f"{kept} — <i>loading {html.escape(self._coming or 'the default model')}…</i>"
        elif info is not None and r is not None and not same and st.busy:
            coming = f"{kept} — <i>running {html.escape(info.name)}…</i>"
        elif r is not None and incomplete(r):  # issue 24 C: a long run's layers as they come, or those a Stop kept
            running = st.busy and st.run_status() is not None
            coming = (f" — <b>{incomplete(r)}</b>"
                      + (f" <i>({html.escape(st.watch.line())})</i>" if running else " (stopped)"))
        elif r is not None and st.busy and st.run_status() is not None:  # issue 24: a new input's run is in flight
            coming = f" — <b>{PREVIOUS}</b> <i>({html.escape(st.watch.line())})</i>"
        elif info is not None and r is not None and not same:
            # the new model's run failed (the banner says why): these maps are still the old model's
            coming = f" — <i>{html.escape(info.name)} is loaded but has not run this input</i>"
        else:
            coming = ""
        if r is None:
            idle = waiting_for_input(info) if info is not None else "Load a model to see its attention."
            self.title.setText(coming.removeprefix(" — ") or idle)
            return
        tag = " — <b>UNTRAINED (random weights)</b>" if same and not info.trained else ""
        note = f"<br><i>{html.escape(info.note)}</i>" if same and info.note else ""
        grid = st.grid_image
        if grid is None and self._overview is not None and self._overview[0] == result_tag(r):
            grid = self._overview[1]
        stack = getattr(grid, "stack", "encoder")  # the maps drawn, even while another stack is pooled
        m = stack_maps(r, stack)
        L, H = m.attentions.shape[:2]
        hidden = getattr(grid, "hidden_specials", False)
        rs, cs = int(np.count_nonzero(m.row_special)), int(np.count_nonzero(m.col_special))
        R, C = len(m.rows), len(m.cols)
        if m.square:
            count = (f"{R - rs:,} tokens shown ({rs} special hidden, rows renormalised)" if hidden and rs
                     else f"{R:,} tokens")
        else:
            shown_r, shown_c = (R - rs, C - cs) if hidden else (R, C)
            count = (f"{shown_r} target × {shown_c} source tokens"
                     + (" (special hidden, rows renormalised)" if hidden and (rs or cs) else ""))
        what = ""
        if r.decoder_attentions is not None:
            what = f" <b>{html.escape(STACK_NAMES[m.stack])}</b>,"
        if m.stack == "cross":
            how = ("Row t of each map = which source tokens target token t reads "
                   "(each cell squeezes the target × source map into a square).")
        elif m.stack == "decoder":
            how = "Row t of each map = where target token t looks (only at itself and earlier ones)."
        else:
            how = "Row i of each map = where token i looks."
        if m.stack == "encoder" and getattr(r, "sinks", None) is not None:  # gpt-oss's learned sinks
            mean = float(np.mean(r.sinks))
            how += (f" Each map's first column is the <b>sink</b>: the share of each row its head's learned sink "
                    f"takes (the keys get the rest; {mean:.0%} on average).")
        long = ""
        if getattr(r, "is_lazy", False):
            filled = self.overview_state()
            filled = "" if filled == incomplete(r) else filled  # already said after the shape
            long = (" Each head is pooled to its cell from q and k (the maps of a long input are not kept)"
                    + (f": <i>{filled}</i>" if filled else "") + "."
                    + (" Special tokens are shown (hiding them applies to shorter inputs)." if st.hide_special else ""))
        self.title.setText(f"<b>{html.escape(r.model)}</b>{tag}:{what} {L} layers × {H} heads, {count}{coming}. "
                           f"{how}{grid_note(info, L, H) if same and m.stack == 'encoder' else ''} Click a head to "
                           f"open it.{long}" + note)

    # --------------------------------------------------------------------------------- input
    def cell_at(self, scene_pos) -> tuple[int, int] | None:
        """(layer, head) under a scene position, or None outside the mosaic."""
        if self._shape == (0, 0):
            return None
        p = self.plot.vb.mapSceneToView(scene_pos)
        L, H = self._shape
        col, row = int(p.x() // 1), int(p.y() // 1)
        if 0 <= row < L and 0 <= col < H and p.x() >= 0 and p.y() >= 0:
            return row, col
        return None

    def cell_center(self, layer: int, head: int):
        """Scene position of a cell's centre (used by tests and the benchmark to click)."""
        return self.plot.vb.mapViewToScene(pg.Point(head + 0.5, layer + 0.5))

    def _clicked(self, ev) -> None:
        hit = self.cell_at(ev.scenePos())
        if hit is None:
            return
        self.state.select(*hit)
        self.head_opened.emit(*hit)
