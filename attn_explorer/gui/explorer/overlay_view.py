"""The patch-overlay page (image models): the picture with one query's attention over its patches.

One small overlay per head of the selected layer, and a large one for the selected head. The query is
[CLS] until you click a patch in the large picture; then that patch asks. Heat is blended in NumPy
(one RGB image per panel), coloured from 0 to each map's own 98th percentile, with adjustable opacity;
blocky (one colour per patch, what the model sees) or smooth (bilinear between patch centres). The
colour bar gives the large map's scale in attention weight.
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QHBoxLayout, QLabel, QSlider, QStackedLayout, QVBoxLayout,
                               QWidget)

from attn_explorer.gui.explorer import vlm_overlay  # issue 26 B: vision-language runs

from attn_explorer.gui.widgets.heatmap import (LazyPage, PaintedGraphicsWidget, colormap, follow_loading,
                                       set_bar_label)
from attn_explorer.gui.widgets.overlay import THUMB, blend, heat_label, heat_levels, patch_heat, thumbnail
from attn_explorer.session.long_view import FOCUS_LANE, query_rows_job, result_tag
from attn_explorer.session.state import SessionState

OPEN_HINT = ("Open an image (File → Open image…, drag one in, or pick a sample) to see which patches each "
             "head looks at.")
class PatchOverlayView(LazyPage, QWidget):
    def __init__(self, state: SessionState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        self.alpha = QSlider(Qt.Horizontal)
        self.alpha.setRange(0, 100)
        self.alpha.setValue(int(round(state.alpha * 100)))
        self.alpha.setMaximumWidth(220)
        self.alpha_label = QLabel(f"overlay opacity {state.alpha:.2f}")
        self.smooth = QCheckBox("smooth")
        self.smooth.setToolTip("Blend between patch centres (bilinear) instead of one colour per patch")
        self.placeholder = QLabel(OPEN_HINT)
        self.placeholder.setAlignment(Qt.AlignCenter)
        self.placeholder.setWordWrap(True)

        self.canvas = PaintedGraphicsWidget()
        self.small = self.canvas.addPlot(row=0, col=0)
        self.big = self.canvas.addPlot(row=0, col=1)
        self.canvas.ci.layout.setColumnStretchFactor(0, 1)
        self.canvas.ci.layout.setColumnStretchFactor(1, 1)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=colormap(state.colormap), interactive=False,
                                        width=14)
        set_bar_label(self.colorbar, "weight")
        self.colorbar.axis.enableAutoSIPrefix(False)  # weights read as 0.012, not "12 (x0.001)"
        self.colorbar.axis.setWidth(None)  # wide enough for "0.012" and the title beside it
        self.canvas.addItem(self.colorbar, row=0, col=2)
        for p in (self.small, self.big):
            p.invertY(True)
            p.setAspectLocked(True)
            p.hideAxis("left")
            p.hideAxis("bottom")
            p.setMenuEnabled(False)
            p.hideButtons()
            p.setMouseEnabled(x=False, y=False)
        self.small_img = pg.ImageItem(axisOrder="row-major")
        self.big_img = pg.ImageItem(axisOrder="row-major")
        self.small.addItem(self.small_img)
        self.big.addItem(self.big_img)
        self.query_box = pg.PlotCurveItem(pen=pg.mkPen("#ff3b30", width=2))
        self.big.addItem(self.query_box)
        self.sel_box = pg.PlotCurveItem(pen=pg.mkPen("#ff3b30", width=2))
        self.small.addItem(self.sel_box)
        self._labels: list[pg.TextItem] = []
        self.big_rgb: np.ndarray | None = None
        self._cols = 1
        self._rows = None  # long inputs: session.long_view.QueryRows of the query and layer shown
        # vision-language runs (issue 26 B): which token asks, which heads are drawn, the worker's answer
        self.token_pick = QComboBox()
        self.token_pick.setToolTip("The token whose attention to the image tokens is drawn on the picture")
        self.average = vlm_overlay.average_box()
        self._vlm = None  # session.vlm.VlmOverlay of the token, layer, head and average shown

        body = QWidget()
        self.stack = QStackedLayout(body)
        self.stack.addWidget(self.placeholder)
        self.stack.addWidget(self.canvas)
        bar = QHBoxLayout()
        bar.addWidget(self.caption, 1)
        bar.addWidget(self.smooth)
        bar.addWidget(self.alpha_label)
        bar.addWidget(self.alpha)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(bar)
        self.vlm_bar = QWidget()  # vision-language runs: which token asks, which heads (hidden otherwise)
        vrow = QHBoxLayout(self.vlm_bar)
        vrow.setContentsMargins(0, 0, 0, 0)
        vrow.addWidget(QLabel("Token:"))
        vrow.addWidget(self.token_pick)
        vrow.addWidget(QLabel("drawn:"))
        vrow.addWidget(self.average)
        vrow.addStretch(1)
        self.vlm_bar.hide()
        lay.addWidget(self.vlm_bar)
        lay.addWidget(body, 1)

        self.alpha.valueChanged.connect(lambda v: state.set_options(alpha=v / 100.0))
        self.smooth.toggled.connect(lambda *_: self.refresh())
        self.token_pick.activated.connect(lambda i: state.set_query(self.token_pick.itemData(i)))
        self.average.currentIndexChanged.connect(lambda *_: self.refresh())
        follow_loading(state, self.placeholder.setText)
        state.input_cleared.connect(lambda: (self.caption.setText(""), self.stack.setCurrentIndex(0)))
        vlm_overlay.watch_input(self)  # a new picture or prompt: the old overlay and caption go until it is drawn
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        self._place: tuple | None = None  # (y, x, grid, query): the chosen patch's centre as a fraction of the picture
        state.query_changed.connect(self._remember_place)
        state.attention_ready.connect(self._keep_place)  # before drawing: a new patch grid keeps the place
        state.attention_ready.connect(self.refresh)
        state.query_changed.connect(lambda *_: self.refresh())
        state.selection_changed.connect(lambda *_: self.refresh())
        state.options_changed.connect(self.refresh)

    # ----------------------------------------------------------------------------------- drawing
    def refresh(self, *_):
        if not self.needs_draw():
            return
        r = self.state.result
        vlm = vlm_overlay.is_vlm(r) and r.image is not None
        self.vlm_bar.setVisible(vlm)
        if vlm:
            vlm_overlay.draw_vlm(self, r)
            return
        if r is None or r.grid is None or r.image is None:
            self.caption.setText("")  # it described a picture that is no longer on screen
            if r is not None:
                self.placeholder.setText(OPEN_HINT)
            self.stack.setCurrentIndex(0)
            return
        self.stack.setCurrentIndex(1)
        st = self.state
        self.alpha_label.setText(f"overlay opacity {st.alpha:.2f}")
        L, H, N, _ = r.attentions.shape
        q = min(st.query, N - 1)
        rows, cols = r.grid
        if getattr(r, "is_lazy", False):  # a long input (a large picture): only the query's rows, from its lane
            got = self._rows
            if got is None or (got.tag, got.query, got.layers) != (result_tag(r), q, (st.layer,)):
                self._ask_rows(r, q, st.layer)
                return
            layer = got.values[:, None, :]  # (H, 1, N): row 0 of each head is the query's
            q_row = 0
        else:
            layer = r.attentions[st.layer]  # (H, N, N)
            q_row = q
        # the large overlay: the selected head
        off = r.patch_offset
        smooth = self.smooth.isChecked()
        hidden = r.special if st.hide_special else None
        heat = patch_heat(layer[st.head, q_row], r.grid, off, hidden)
        log = st.log_scale
        self.big_rgb = blend(r.image, heat, st.alpha, st.colormap, smooth, log)
        self.colorbar.setColorMap(colormap(st.colormap))
        self.colorbar.setLevels(values=heat_levels(heat, log)[1])
        set_bar_label(self.colorbar, heat_label("weight", log))
        ih, iw = r.image.shape[:2]
        self.big_img.setImage(self.big_rgb, levels=(0, 255), autoLevels=False)
        self.big_img.setRect(QRectF(0, 0, iw, ih))
        self.big.setRange(xRange=(0, iw), yRange=(0, ih), padding=0.02)
        self.big.setTitle(f"layer {st.layer}, head {st.head}")
        if q >= off:
            pr, pc = divmod(q - off, cols)
            y0, y1 = pr * ih / rows, (pr + 1) * ih / rows
            x0, x1 = pc * iw / cols, (pc + 1) * iw / cols
            self.query_box.setData([x0, x1, x1, x0, x0], [y0, y0, y1, y1, y0])
        else:
            self.query_box.setData([], [])
        # the small overlays: every head of the layer, one mosaic image
        thumb = thumbnail(r.image)
        cols_m = self._cols = max(1, math.ceil(math.sqrt(H)))
        rows_m = math.ceil(H / cols_m)
        gap = 4
        side = THUMB + gap
        mosaic = np.full((rows_m * side - gap, cols_m * side - gap, 3), 255, np.uint8)
        for h in range(H):
            y, x = divmod(h, cols_m)
            tile = blend(thumb, patch_heat(layer[h, q_row], r.grid, off, hidden), st.alpha, st.colormap, smooth, log)
            mosaic[y * side: y * side + THUMB, x * side: x * side + THUMB] = tile
        self.small_img.setImage(mosaic, levels=(0, 255), autoLevels=False)
        self.small.setRange(xRange=(0, mosaic.shape[1]), yRange=(0, mosaic.shape[0]), padding=0.02)
        self.small.setTitle(f"layer {st.layer}: every head (click one)")
        sy, sx = divmod(st.head, cols_m)
        x0, y0 = sx * side, sy * side
        self.sel_box.setData([x0, x0 + THUMB, x0 + THUMB, x0, x0], [y0, y0, y0 + THUMB, y0 + THUMB, y0])
        self._place_labels(H, cols_m, side)
        info = st.info
        tag = "" if info is None or info.trained else " <b>Untrained model (random weights): patterns mean nothing.</b>"
        if info is not None and info.note:
            tag += f"<br><i>{info.note}</i>"
        qname = "[CLS]" if q < off else f"patch row {(q - off) // cols}, col {(q - off) % cols}"
        self.caption.setText(f"Query: <b>{qname}</b> — click a patch on the right to ask from there. "
                             f"{rows}×{cols} patches; colour and opacity = "
                             + ("log₁₀ weight, over 4 powers of ten below" if log else "weight, from 0 to")
                             + " each map's 98th percentile (the top 2% saturate; the bar is the large map's scale)."
                             + (" Special tokens hidden: weights renormalised over the patches." if hidden is not None
                                else "") + tag)

    def _ask_rows(self, r, q: int, layer: int) -> None:
        """Ask the focus lane for query q's row in every head of `layer` (a long input); until it comes, the
        caption says so and the old query's heat is not left on screen."""
        self._rows = None
        self.big_rgb = None
        self.big_img.clear()
        self.small_img.clear()
        self.query_box.setData([], [])
        self.caption.setText(f"Computing the query's attention in layer {layer}'s heads from q and k "
                             f"({r.num_tokens:,} tokens)…")
        want = (result_tag(r), q, (layer,))

        def arrived(got) -> None:
            now = self.state.result
            if now is not None and (result_tag(now), min(self.state.query, now.num_tokens - 1),
                                    (self.state.layer,)) == want:
                self._rows = got
                self.refresh()

        self.state.submit(query_rows_job, r, q, (layer,), key=FOCUS_LANE + ":overlay", uses_model=False,
                          on_result=arrived)

    def _place_labels(self, H: int, cols_m: int, side: int) -> None:
        while len(self._labels) < H:
            t = pg.TextItem(color="w", fill=pg.mkBrush(0, 0, 0, 140), anchor=(0, 0))
            self.small.addItem(t)
            self._labels.append(t)
        for h, t in enumerate(self._labels):
            if h < H:
                y, x = divmod(h, cols_m)
                t.setText(f"H{h}")
                t.setPos(x * side + 2, y * side + 2)
                t.show()
            else:
                t.hide()

    # ----------------------------------------------------------------------------------- the query's place
    def _remember_place(self, q: int) -> None:
        """Where in the picture the asking patch is, so another image size keeps it there (not its number)."""
        r = self.state.result
        if r is None or r.grid is None or q < r.patch_offset:
            self._place = None
            return
        rows, cols = r.grid
        pr, pc = divmod(q - r.patch_offset, cols)
        self._place = ((pr + 0.5) / rows, (pc + 0.5) / cols, tuple(r.grid), q)

    def _keep_place(self, r) -> None:
        """A result on a new patch grid (the image size changed): ask from the patch at the same place."""
        place = self._place
        if place is None or r.grid is None or tuple(r.grid) == place[2]:
            return
        fy, fx, _grid, q = place
        if self.state.query != min(q, r.num_tokens - 1):
            self._place = None  # the query moved on (a new picture starts at [CLS]): nothing to keep
            return
        rows, cols = r.grid
        pr, pc = min(int(fy * rows), rows - 1), min(int(fx * cols), cols - 1)
        self._place = None
        self.state.set_query(r.patch_offset + pr * cols + pc)  # query_changed remembers the new place

    # ----------------------------------------------------------------------------------- input
    def patch_center(self, row: int, col: int):
        """Scene position of a patch's centre in the large overlay (tests click here)."""
        r = self.state.result
        ih, iw = r.image.shape[:2]
        rows, cols = vlm_overlay.patch_grid(r) if vlm_overlay.is_vlm(r) else r.grid
        return self.big.vb.mapViewToScene(pg.Point((col + 0.5) * iw / cols, (row + 0.5) * ih / rows))

    def _clicked(self, ev) -> None:
        r = self.state.result
        vlm = vlm_overlay.is_vlm(r) and r.image is not None
        if r is None or (r.grid is None and not vlm):
            return
        pos = ev.scenePos()
        if self.big.vb.sceneBoundingRect().contains(pos):
            p = self.big.vb.mapSceneToView(pos)
            ih, iw = r.image.shape[:2]
            rows, cols = vlm_overlay.patch_grid(r) if vlm else r.grid
            pr, pc = int(p.y() * rows // ih), int(p.x() * cols // iw)
            if 0 <= pr < rows and 0 <= pc < cols and p.x() >= 0 and p.y() >= 0:
                if vlm:  # the image token at that patch asks (the first view's)
                    at = vlm_overlay.image_token_at(r, pr, pc)
                    if at is not None:
                        self.state.set_query(at)
                    return
                self.state.set_query(r.patch_offset + pr * cols + pc)
        elif self.small.vb.sceneBoundingRect().contains(pos):
            p = self.small.vb.mapSceneToView(pos)
            side = THUMB + 4
            x, y = int(p.x() // side), int(p.y() // side)
            h = y * self._cols + x
            if p.x() >= 0 and p.y() >= 0 and 0 <= h < r.attentions.shape[1]:
                self.state.select(head=h)
