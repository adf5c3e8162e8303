"""The contribution-graph page: information flow routes (Ferrando & Voita 2024) drawn as a layered graph.

Tokens run across, layers up (the embeddings at the bottom, the output at the top). From the chosen output token
the edges whose share of a node's sum reaches the threshold are followed down: blue lines carry a token's
information through a layer's attention, grey ones up its own residual stream; a node's orange says how much the
MLP wrote there. Clicking an attention edge shows which heads carry it and which tokens its main head promotes and
suppresses (its output through the unembedding); double-click, or the button, opens that head's map.
The shares come from one worker job (`session.lens.flow_job`); moving the threshold only traces again (NumPy).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QComboBox, QLabel, QPushButton, QScrollArea, QSlider, QSplitter, QVBoxLayout, QWidget

from attn_explorer.gui.interventions.tool import ToolPage, visible
from attn_explorer.gui.widgets.heatmap import PaintedGraphicsWidget, TokenAxis
from attn_explorer.session.lens import flow_job, head_tokens_job, trace
from attn_explorer.session.state import SessionState

ATTN, RESID = "#3b6fb6", "#9a9a9a"
PICK_PX = 9  # how near (pixels) a click must come to an edge to pick it
WIDTHS = (1.0, 2.0, 3.5, 5.0, 7.0)  # pen widths for shares in (τ, .1], (.1, .2], (.2, .35], (.35, .5], above


def width_of(weight: float) -> float:
    for cut, w in zip((0.1, 0.2, 0.35, 0.5), WIDTHS):
        if weight <= cut:
            return w
    return WIDTHS[-1]


class FlowPage(ToolPage):
    WHAT = "The contribution graph"
    follow_up_lanes = ("lens-head-tokens",)

    def __init__(self, state: SessionState, parent: QWidget | None = None):
        self.canvas = PaintedGraphicsWidget()
        self.token_axis = TokenAxis("bottom", rotate=True)
        self.level_axis = TokenAxis("left")
        self.plot = self.canvas.addPlot(axisItems={"bottom": self.token_axis, "left": self.level_axis})
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.curves: list[pg.PlotCurveItem] = []
        self.nodes = pg.ScatterPlotItem(size=8, pen=pg.mkPen("#555"))
        self.chosen_curve = pg.PlotCurveItem(pen=pg.mkPen("#f0a000", width=6))
        self.plot.addItem(self.chosen_curve)
        self.plot.addItem(self.nodes)
        self.panel = QLabel("")
        self.panel.setWordWrap(True)
        self.panel.setTextFormat(Qt.RichText)
        self.panel.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        self.open_button = QPushButton("Open the head's map")
        self.open_button.setEnabled(False)
        self.tokens_label = QLabel("")
        self.tokens_label.setWordWrap(True)
        self.tokens_label.setTextFormat(Qt.RichText)
        self.tokens_label.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(4, 0, 0, 0)
        sl.addWidget(self.panel)
        sl.addWidget(self.open_button)
        sl.addWidget(self.tokens_label)
        sl.addStretch(1)
        side_scroll = QScrollArea()  # the panel's lists never make the page taller than the window
        side_scroll.setWidgetResizable(True)
        side_scroll.setFrameShape(QScrollArea.NoFrame)
        side_scroll.setWidget(side)
        side_scroll.setMinimumWidth(240)
        self.splitter = QSplitter(Qt.Horizontal)
        self.splitter.addWidget(self.canvas)
        self.splitter.addWidget(side_scroll)
        self.splitter.setStretchFactor(0, 4)
        self.splitter.setStretchFactor(1, 1)
        super().__init__(state, self.splitter, parent)
        self.output_box = QComboBox()
        self.output_box.setToolTip("The output token whose routes are traced (the next token after this position)")
        self.output_box.setMinimumContentsLength(14)
        self.slider = QSlider(Qt.Horizontal)
        self.slider.setRange(1, 50)
        self.slider.setValue(4)
        self.slider.setMaximumWidth(180)
        self.slider.setToolTip("Keep an edge when its share of the node it enters is at least this")
        self.threshold_label = QLabel("")
        self.threshold_label.setMinimumWidth(40)
        self.run_button = QPushButton("Run")
        for w in (QLabel("Output after:"), self.output_box, QLabel("Threshold:"), self.slider, self.threshold_label,
                  self.run_button):
            self.control_row.addWidget(w)
        self.finish_bar()
        self.graph = None  # the FlowGraph on screen
        self.edges: list = []  # the traced edges drawn
        self.chosen = None  # the Edge picked
        self.slider.valueChanged.connect(lambda *_: self.retrace())
        self.output_box.currentIndexChanged.connect(lambda *_: self.retrace())
        self.run_button.clicked.connect(self.measure)
        self.open_button.clicked.connect(self._open_chosen)
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        self.canvas.viewport().installEventFilter(self)  # double clicks: the plot's items may take them first
        self._show_threshold()

    @property
    def threshold(self) -> float:
        return self.slider.value() / 100.0

    def _show_threshold(self) -> None:
        self.threshold_label.setText(f"{self.threshold:.2f}")

    # --------------------------------------------------------------------------- measuring
    def refresh(self) -> None:
        r = self.usable()
        if r is None or r is self.done_for:
            return
        self.measure()

    def measure(self) -> None:
        r = self.usable()
        if r is None:
            return
        self.done_for = r
        self.state.cancel("lens-head-tokens")
        self.graph = None
        self._choose(None)
        self.readout.setText("")
        self.stack.show_message("Measuring every edge's share (one forward pass that keeps the maps)…")
        x, kw = self.state.run_input()
        self.start(flow_job, x, kw, key="lens-flow", on_result=lambda g: self._ready(r, g), message="Contributions")

    def _ready(self, r, graph) -> None:
        if r is not self.state.result:
            return
        self.graph = graph
        n = len(graph.tokens)
        self.output_box.blockSignals(True)
        self.output_box.clear()
        self.output_box.addItems([f"{j}: {visible(t, 16)}" for j, t in enumerate(graph.tokens)])
        self.output_box.setCurrentIndex(n - 1)
        self.output_box.blockSignals(False)
        self.token_axis.set_labels(graph.tokens)
        L = graph.num_layers
        self.level_axis.set_labels(["embeddings"] + [f"after L{i}" for i in range(L)])
        self.plot.getViewBox().setLimits(xMin=0, xMax=n, yMin=0, yMax=L + 1)
        self.plot.setRange(xRange=(0, n), yRange=(0, L + 1), padding=0.01)
        self.stack.show_canvas()
        self.retrace()

    def retrace(self) -> None:
        """Trace the graph at the slider's threshold from the chosen output token, and draw it."""
        self._show_threshold()
        g = self.graph
        if g is None:
            return
        pos = max(0, self.output_box.currentIndex())
        self.edges, nodes = trace(g, pos, self.threshold)
        self._choose(None)
        self._draw_edges()
        pts = sorted(nodes)
        mlp = [float(g.mlp[lv - 1, t]) if lv > 0 else 0.0 for lv, t in pts]
        self.nodes.setData(x=[t + 0.5 for _, t in pts], y=[lv + 0.5 for lv, _ in pts],
                           brush=[pg.mkBrush(255, int(255 - 140 * m), int(255 - 230 * m)) for m in mlp])
        n_attn = sum(e.kind == "attn" for e in self.edges)
        self.caption.setText(
            f"<b>Contribution graph</b> (Ferrando &amp; Voita 2024) of the token after {visible(g.tokens[pos], 16)!r}: "
            f"{n_attn} attention edges (blue: token → token through a layer's heads) and {len(self.edges) - n_attn} "
            f"residual ones (grey) with an ALTI share of at least {self.threshold:.2f} of the node they enter; "
            f"orange nodes: the MLP's share. Click an edge for its heads.")
        self.caption.setToolTip("A share is ALTI's proximity max(0, ‖y‖₁ − ‖y − z‖₁), normalised over the parts of "
                                "the sum y a node receives. A norm after the attention branch (Gemma's sandwich) is "
                                "frozen at the branch's whole output, so each part goes through it linearly.")

    def _draw_edges(self) -> None:
        for c in self.curves:
            self.plot.removeItem(c)
        self.curves = []
        groups: dict[tuple[str, float], list] = {}
        for e in self.edges:
            groups.setdefault((e.kind, width_of(e.weight)), []).append(e)
        for (kind, width), es in sorted(groups.items(), key=lambda kv: kv[0][1]):
            xs = np.ravel([[e.src + 0.5, e.dst + 0.5] for e in es])
            ys = np.ravel([[e.layer + 0.5, e.layer + 1.5] for e in es])
            curve = pg.PlotCurveItem(xs, ys, connect="pairs", pen=pg.mkPen(ATTN if kind == "attn" else RESID,
                                                                           width=width))
            self.plot.addItem(curve)
            curve.setZValue(-1)
            self.curves.append(curve)

    # --------------------------------------------------------------------------- picking an edge
    def edge_point(self, e):
        """Scene position of an edge's midpoint (tests click here)."""
        vb = self.plot.getViewBox()
        return vb.mapViewToScene(pg.Point((e.src + e.dst) / 2 + 0.5, e.layer + 1.0))

    def edge_at(self, scene_pos):
        """The drawn edge nearest a scene position, within PICK_PX pixels, or None."""
        if not self.edges:
            return None
        vb = self.plot.getViewBox()
        if not vb.sceneBoundingRect().contains(scene_pos):
            return None
        p = vb.mapSceneToView(scene_pos)
        sx, sy = vb.viewPixelSize()
        a = np.array([[e.src + 0.5, e.layer + 0.5] for e in self.edges])
        b = np.array([[e.dst + 0.5, e.layer + 1.5] for e in self.edges])
        scale = np.array([1 / sx, 1 / sy])
        a, b, q = a * scale, b * scale, np.array([p.x(), p.y()]) * scale
        ab = b - a
        t = np.clip(((q - a) * ab).sum(1) / np.maximum((ab * ab).sum(1), 1e-12), 0, 1)
        d = np.linalg.norm(a + t[:, None] * ab - q, axis=1)
        d = d + np.array([0.0 if e.kind == "attn" else 0.5 for e in self.edges])  # prefer attention on a tie
        i = int(np.argmin(d))
        return self.edges[i] if d[i] <= PICK_PX else None

    def _clicked(self, ev) -> None:
        e = self.edge_at(ev.scenePos())
        if e is not None and e is not self.chosen:
            self._choose(e)

    def eventFilter(self, obj, ev):  # noqa: N802 - Qt API
        """A double click on an attention edge opens its head's map."""
        if ev.type() == QEvent.MouseButtonDblClick and obj is self.canvas.viewport():
            e = self.edge_at(self.canvas.mapToScene(ev.position().toPoint()))
            if e is not None and e.kind == "attn":
                if e is not self.chosen:
                    self._choose(e)
                self._open_chosen()
        return super().eventFilter(obj, ev)

    def _choose(self, e) -> None:
        """Show edge e in the side panel (None: nothing chosen), and ask for its head's tokens."""
        self.chosen = e
        self.tokens_label.setText("")
        self.open_button.setEnabled(False)
        if e is None:
            self.chosen_curve.setData([], [])
            self.panel.setText("Click an edge of the graph to see which heads carry it." if self.edges else "")
            return
        g = self.graph
        self.chosen_curve.setData([e.src + 0.5, e.dst + 0.5], [e.layer + 0.5, e.layer + 1.5])
        src, dst = visible(g.tokens[e.src], 16), visible(g.tokens[e.dst], 16)
        if e.kind == "resid":
            self.panel.setText(f"<b>Residual stream</b> of {dst!r} through layer {e.layer}: {e.weight:.0%} of its sum "
                               f"after the attention step. (The MLP then wrote {g.mlp[e.layer, e.dst]:.0%} of the "
                               f"layer's output there.)")
            return
        shares = g.head_shares(e.layer, e.src, e.dst)
        order = np.argsort(-shares)[:4]
        heads = ", ".join(f"H{h} {shares[h]:.0%}" for h in order if shares[h] > 0.005)
        self.panel.setText(f"<b>L{e.layer}: {src!r} → {dst!r}</b><br>{e.weight:.0%} of {dst!r}'s sum after the "
                           f"attention step.<br>Heads carrying it (by ‖α f(x)‖₁): {heads}.")
        self.open_button.setText(f"Open L{e.layer} H{e.head}'s map")
        self.open_button.setEnabled(True)
        self.tokens_label.setText(f"What L{e.layer} H{e.head} writes at {dst!r}…")
        x, kw = self.state.run_input()
        r = self.done_for
        self.state.submit(head_tokens_job, x, kw, e.layer, e.head, e.dst, 6, key="lens-head-tokens",
                          on_result=lambda tk: self._tokens_ready(r, e, tk), on_error=self._tokens_failed)

    def _tokens_failed(self, message: str) -> None:
        self.tokens_label.setText("")
        self.state.error_raised.emit(message)

    def _tokens_ready(self, r, e, tokens) -> None:
        if e is not self.chosen or r is not self.state.result:
            return
        up, down = tokens
        fmt = lambda items: "<br>".join(f"{visible(t, 18)!r} {v:+.2f}" for t, v in items)  # noqa: E731
        self.tokens_label.setText(
            f"<b>L{e.layer} H{e.head}</b>'s output at {visible(self.graph.tokens[e.dst], 16)!r} through the (frozen) "
            f"final norm and W_U:<br><b>promotes</b><br>{fmt(up)}<br><b>suppresses</b><br>{fmt(down)}")

    def _open_chosen(self) -> None:
        e = self.chosen
        if e is not None and e.kind == "attn":
            self.open_head(e.layer, e.head)
