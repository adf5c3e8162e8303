"""The head overview page: one L×H grid per statistic, so every head's kind shows at a glance.

Mean row entropy, the share on special and first tokens (sinks), mean attention distance (tokens, or
pixels for images) and the share of rows whose top key is the previous or the next token. The lines
above the grids name the clearest heads; clicking one of them, or any cell, opens that head.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF

from attn_explorer.gui.analysis.common import AnalysisPage, cell_plot, label_cells
from attn_explorer.gui.widgets.heatmap import cell_centre, cell_under, colormap, set_bar_label
from attn_explorer.session.analysis import findings, head_stats_job, long_head_stats_job
from attn_explorer.session.mixers import NOT_PROBABILITIES, head_exists, is_recurrent, overview_note, softmax_only
from attn_explorer.session.state import SessionState
from attn_explorer.session.vlm import patch_grid_of

GRIDS = ("entropy", "sink", "distance", "prev", "next")
# short: a plot is at least as wide as its title, and three grids share 600 px at 1024×700
TITLES = {"entropy": "entropy (bits)", "sink": "on special/first", "distance": "distance",
          "prev": "previous token", "next": "next token"}  # the rows whose top key is that token
HINT = "Hover a cell for its value; click it to open that head."
LEARNED = "learned sink"  # gpt-oss: the sixth grid, each head's mean share given to its learned sink


class HeadOverviewPage(AnalysisPage):
    def __init__(self, state: SessionState, parent=None):
        # a long input's statistics: tiles from q and k, in a worker, on the frame's progress line
        super().__init__(state, parent, again="Measure again")
        self.caption.setOpenExternalLinks(False)
        self.caption.linkActivated.connect(self._link)
        self.unused_note("per-head statistics of the whole maps (the sink column is about the special "
                         "tokens, so they stay in)", log="each grid is coloured from 0 to its largest value")
        self.stats = None
        self._for = None  # the result the stats describe
        self.plots: dict[str, pg.PlotItem] = {}
        self.images: dict[str, pg.ImageItem] = {}
        self.bars: dict[str, pg.ColorBarItem] = {}
        for i, name in enumerate(GRIDS):
            p = cell_plot(self.canvas, i // 3, i % 3)
            if i % 3 == 0:
                p.setLabel("left", "layer")
            p.setLabel("bottom", "head")
            img = pg.ImageItem(axisOrder="row-major")
            p.addItem(img)
            bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), interactive=False, width=10)
            bar.setImageItem(img, insert_in=p)
            bar.axis.enableAutoSIPrefix(False)
            set_bar_label(bar, "")  # the plot's title names the unit
            self.plots[name], self.images[name], self.bars[name] = p, img, bar
        # gpt-oss: the sixth grid, made the first time a model with learned sinks is measured (never hidden after:
        # a hidden plot's axes crashed pyqtgraph at exit), emptied for a model without them
        self.learned_plot = self.learned_image = self.learned_bar = None
        self.learned: np.ndarray | None = None  # (L, H) each head's mean sink share, or None
        self.sel_box = pg.PlotCurveItem(pen=pg.mkPen("#ff3b30", width=2))
        self._measuring = None  # the long result being measured now, or the one whose measuring was stopped
        self.readout.setText(HINT)
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        state.attention_ready.connect(self.refresh)
        state.options_changed.connect(self.refresh)
        state.selection_changed.connect(lambda *_: self._mark())

    # ------------------------------------------------------------------------------- compute
    def refresh(self, *_):
        r = self.result_to_draw()
        if r is None:
            return
        if self._for is not None and _source(self._for) is _source(r) and self.stats is not None:
            self._for = r  # the same maps (a redrawn record of the same run)
            self._draw()
            return
        self.stats, self._for = None, None
        self.caption.setText("")
        info = self.state.info
        grid = patch_grid_of(r)  # a vision-language run: its tokens, not patches (issue 26 B)
        patch = info.patch_size if info is not None and grid is not None else None
        if r.is_lazy:
            if self._measuring is None or self._measuring.lazy is not r.lazy:  # else it goes on (or stays stopped)
                self._measure_long(r, patch)
            return
        self._measuring = None
        self.progress.finish()
        self.stack.show_message("Measuring every head…")
        self.state.submit(head_stats_job, r.attentions, r.special, grid, r.patch_offset, patch,
                          key="analysis-overview", on_result=lambda s: self._arrived(r, s), on_error=self._failed,
                          uses_model=False)

    def _measure_long(self, r, patch) -> None:
        """A long input keeps no maps: every head's statistics are computed in row tiles from q and k, in a
        worker that reports how far it got and stops when cancelled."""
        self._measuring = r
        self.progress.start(f"Measuring every head of {r.num_tokens:,} tokens in tiles from q and k…")
        self.stack.show_message("No maps were kept for this long input: every head's statistics are computed "
                                "exactly from each layer's q and k, and appear once every head is measured.")
        self.state.submit(long_head_stats_job, r, patch_grid_of(r), r.patch_offset, patch, key="analysis-overview",
                          on_result=lambda s: self._arrived(r, s), on_error=self._failed_long,
                          on_progress=self.progress.advance, uses_model=False)

    def cancel(self) -> None:
        self.state.cancel("analysis-overview")
        self.progress.stopped("Stopped: the statistics of this input were not measured.")
        self.stack.show_message("Measuring was stopped before every head was measured: nothing is shown. "
                                "Press Measure again to start over.")

    def restart(self) -> None:
        self.stats, self._for, self._measuring = None, None, None
        self.refresh()

    def _failed_long(self, message: str) -> None:
        self.progress.finish()
        self._measuring = None
        self._failed(message)

    def _arrived(self, r, s) -> None:
        now = self.state.result
        if now is None or _source(r) is not _source(now):
            return  # a newer result is on its way and will be measured
        self.progress.finish()
        self.stats, self._for, self._measuring = s, now, None
        self._draw()

    # ------------------------------------------------------------------------------- drawing
    def _draw(self) -> None:
        self.stack.show_canvas()
        L, H = self.stats.entropy.shape
        # a hybrid's recurrent layers and padded heads: blank, and never named below (issue 25)
        s, picks = softmax_only(self.stats, self.state.info)
        cmap = colormap(self.state.colormap)
        for name in GRIDS:
            v = s.get(name)
            hi = float(np.nanmax(v)) if name in ("entropy", "distance") and np.isfinite(v).any() else 1.0
            levels = (0.0, hi if hi > 0 else 1.0)
            self.images[name].setImage(v.astype(np.float32), levels=levels, autoLevels=False)
            self.images[name].setRect(QRectF(0, 0, H, L))
            self.bars[name].setColorMap(cmap)
            self.bars[name].setLevels(values=levels)
            p = self.plots[name]
            p.setTitle(TITLES[name] + (f" ({s.distance_unit})" if name == "distance" else ""), size="9pt")
            p.setRange(xRange=(0, H), yRange=(0, L), padding=0.02)
            label_cells(p, L, H)
        self._draw_learned(L, H, cmap)
        self._mark()
        lines = [f"<a href='{f.layer},{f.head}'>{f.text}</a>" if f.layer >= 0 else f.text
                 for f in findings(picks)]
        if self.learned is not None:
            l, h = np.unravel_index(int(np.argmax(self.learned)), self.learned.shape)
            lines.append(f"the learned sinks take {float(self.learned.mean()):.0%} of the weight on average, most in "
                         f"<a href='{l},{h}'>L{l} H{h} ({float(self.learned[l, h]):.0%})</a>")
        info = self.state.info
        tag = "" if info is None or info.trained else "<br><b>Untrained model (random weights): patterns mean nothing.</b>"
        r = self._for
        how = (f" Measured exactly in tiles from each layer's q and k ({r.num_tokens:,} tokens: no maps kept)."
               if r is not None and r.is_lazy else "")
        how += overview_note(info, L)
        self.caption.setText("<b>Head overview</b> — " + "; ".join(lines) + "." + how + tag)

    def _draw_learned(self, L: int, H: int, cmap) -> None:
        """gpt-oss: each head's mean share of a row given to its learned sink (RunResult.sinks), else hidden."""
        sinks = getattr(self._for, "sinks", None)
        self.learned = None if sinks is None else np.asarray(sinks, dtype=np.float32).mean(axis=-1)
        if self.learned is None:
            if self.learned_plot is not None:
                self.learned_image.clear()
                self.learned_plot.setTitle("(no learned sinks)", size="9pt")
            return
        if self.learned_plot is None:
            self._make_learned_plot()
        p = self.learned_plot
        self.learned_image.setImage(self.learned, levels=(0.0, 1.0), autoLevels=False)
        self.learned_image.setRect(QRectF(0, 0, H, L))
        self.learned_bar.setColorMap(cmap)
        p.setTitle(LEARNED + " (share)", size="9pt")
        p.setRange(xRange=(0, H), yRange=(0, L), padding=0.02)
        label_cells(p, L, H)

    def _make_learned_plot(self) -> None:
        p = cell_plot(self.canvas, 1, 2)
        p.setLabel("bottom", "head")
        img = pg.ImageItem(axisOrder="row-major")
        p.addItem(img)
        bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), interactive=False, width=10)
        bar.setImageItem(img, insert_in=p)
        bar.axis.enableAutoSIPrefix(False)
        set_bar_label(bar, "")
        self.learned_plot, self.learned_image, self.learned_bar = p, img, bar

    def _mark(self) -> None:
        if self.stats is None:
            return
        l, h = self.state.layer, self.state.head
        if self.sel_box.parentItem() is None or self.sel_box.getViewBox() is not self.plots["prev"].vb:
            self.plots["prev"].addItem(self.sel_box)
        self.sel_box.setData([h, h + 1, h + 1, h, h], [l, l, l + 1, l + 1, l])

    # ------------------------------------------------------------------------------- input
    def cell_at(self, scene_pos) -> tuple[str, int, int] | None:
        """(statistic, layer, head) under a scene position, or None."""
        if self.stats is None:
            return None
        L, H = self.stats.entropy.shape
        plots = dict(self.plots, **({LEARNED: self.learned_plot} if self.learned is not None else {}))
        for name, p in plots.items():
            hit = cell_under(p, scene_pos, (L, H))
            if hit is not None:
                return name, *hit
        return None

    def cell_center(self, name: str, layer: int, head: int):
        return cell_centre(self.learned_plot if name == LEARNED else self.plots[name], layer, head)

    def describe(self, name: str, l: int, h: int) -> str:
        s = self.stats
        if not head_exists(self.state.info, l, h):
            return f"L{l} H{h}: no such head (this layer has fewer heads)"
        if is_recurrent(self.state.info, l):
            return f"L{l} H{h}: {NOT_PROBABILITIES}"
        parts = [f"entropy {s.entropy[l, h]:.2f} bits", f"sink {s.sink[l, h]:.0%}",
                 f"distance {s.distance[l, h]:.1f} {s.distance_unit}", f"previous {s.prev[l, h]:.0%}",
                 f"next {s.next[l, h]:.0%}"]
        if self.learned is not None:
            parts.append(f"learned sink {float(self.learned[l, h]):.0%} of each row on average")
        return f"L{l} H{h}: " + ", ".join(parts)

    def _hovered(self, pos) -> None:
        hit = self.cell_at(pos)
        self.readout.setText(self.describe(*hit) if hit else HINT)

    def _clicked(self, ev) -> None:
        hit = self.cell_at(ev.scenePos())
        if hit:
            self.open_head(hit[1], hit[2])

    def _link(self, href: str) -> None:
        l, h = (int(x) for x in href.split(","))
        self.open_head(l, h)


def _source(r):
    """What a result's statistics depend on: its maps, or a long input's store (a record redrawn with other
    options, such as Hide specials, shares it, so nothing long is computed again)."""
    return r.lazy if r.is_lazy else r
