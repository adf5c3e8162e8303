"""The Routing page: which experts an MoE model sent each token to, layer by layer.

One cell per (layer, token), coloured by the token's top expert in that layer (the one with the largest
weight), each expert its own colour; a dense layer (Qwen3-MoE's mlp_only_layers, DeepSeek-V3's first layers)
is a grey row. Hovering a cell reads out every chosen expert with its weight. The numbers are the run's own
(RunResult.routing, recorded by hooks in the same forward pass that made the maps): the page redraws with
every run, and never runs the model. A dense model has no routing: the page says so in one line.
"""
from __future__ import annotations

import colorsys
import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF

from attn_explorer.gui.analysis.common import AnalysisPage, untrained_tag
from attn_explorer.gui.widgets.heatmap import TokenAxis, cell_under

DENSE_GREY = (205, 205, 205)
KEY_EXPERTS = 12  # the caption's colour key names the most used experts, at most this many


def expert_colour(e: int) -> tuple[int, int, int]:
    """Expert e's colour: hues a golden angle apart, so neighbouring numbers differ (128 experts stay apart
    enough to tell a run of one expert from its neighbours'), alternating two lightnesses."""
    h = (e * 0.618033988749895) % 1.0
    r, g, b = colorsys.hsv_to_rgb(h, 0.72 if e % 2 else 0.55, 0.92 if e % 2 else 0.78)
    return int(r * 255), int(g * 255), int(b * 255)


def routing_image(top: np.ndarray) -> np.ndarray:
    """uint8 (L, N, 3): each cell its top expert's colour, grey where the layer is dense (-1)."""
    rgb = np.empty(top.shape + (3,), dtype=np.uint8)
    rgb[:] = DENSE_GREY
    for e in np.unique(top[top >= 0]):
        rgb[top == e] = expert_colour(int(e))
    return rgb


def dense_line(info) -> str:
    if info is not None and info.family == "saved run":
        return (f"This saved run of {info.name} holds no routing: a dense model, or a file saved before runs kept "
                "their mixture-of-experts routing.")
    name = info.name if info is not None else "This model"
    return (f"{name} is dense: every token goes through the same MLP, so there is no routing to show. This page "
            "shows mixture-of-experts models (Qwen3-MoE, gpt-oss, Llama 4, DeepSeek-V3).")


class RoutingPage(AnalysisPage):
    def __init__(self, state, parent=None):
        super().__init__(state, parent, rich=True)
        self.token_axis = TokenAxis("bottom", rotate=True)
        self.plot = self.canvas.addPlot(row=0, col=0, axisItems={"left": TokenAxis("left"), "bottom": self.token_axis})
        self.plot.invertY(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=True, y=False)  # the wheel zooms along the tokens
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.shown = None  # (routing, tokens, top experts (L, N)) drawn
        self.unused_note(hide="every token is routed, specials too, so every token is drawn",
                         log="the colours are experts, not amounts")
        self.canvas.scene().sigMouseMoved.connect(self._hovered)
        state.attention_ready.connect(self.refresh)
        state.model_loaded.connect(lambda *_: self.refresh())

    def refresh(self, *_):
        self.readout.setText("")
        r = self.result_to_draw()
        if r is None:
            return
        rt = getattr(r, "routing", None)
        if rt is None:
            self.shown = None
            self.caption.setText("")
            self.stack.show_message(dense_line(self.state.info))
            return
        top, top_w = rt.top()
        L, N = top.shape
        tokens = list(r.tokens)
        self.shown = (rt, tokens, top)
        self.image.setImage(routing_image(top), autoLevels=False)
        self.image.setRect(QRectF(0, 0, N, L))
        self.token_axis.set_labels(tokens)
        left = self.plot.getAxis("left")
        left.set_labels([f"L{i}" if rt.experts[i] is not None else f"L{i} dense" for i in range(L)])
        self.plot.getViewBox().setLimits(xMin=0, xMax=N, yMin=0, yMax=L)
        self.plot.setRange(xRange=(0, N), yRange=(0, L), padding=0)
        self.stack.show_canvas()
        self.caption.setText(self._caption(rt, top, top_w) + untrained_tag(self.state.info))

    def _caption(self, rt, top, top_w) -> str:
        k = rt.experts[rt.moe_layers[0]].shape[1]
        dense = rt.num_layers - len(rt.moe_layers)
        used, counts = np.unique(top[top >= 0], return_counts=True)
        order = used[np.argsort(-counts, kind="stable")][:KEY_EXPERTS]
        key = " ".join(f'<span style="color: rgb{expert_colour(int(e))}">■</span>&nbsp;{int(e)}' for e in order)
        more = f" and {len(used) - len(order)} more" if len(used) > len(order) else ""
        dense_txt = f"; {dense} dense layer{'s' if dense != 1 else ''} in grey" if dense else ""
        return (f"<b>Routing</b> — each token's top expert (the largest of its {k} weights) in each MoE layer, "
                f"of {rt.num_experts} experts{dense_txt}. Mean top weight {np.nanmean(top_w):.2f}. Hover a cell for "
                f"every chosen expert. Most used: {key}{more}.")

    def _hovered(self, pos) -> None:
        if self.shown is None:
            return
        rt, tokens, top = self.shown
        hit = cell_under(self.plot, pos, top.shape)
        if hit is None:
            return
        layer, i = hit
        tok = html.escape(tokens[i])
        if rt.experts[layer] is None:
            self.readout.setText(f'L{layer} token {i} "{tok}": dense layer (one MLP for every token, no routing)')
            return
        pairs = ", ".join(f"expert {int(e)} ({w:.3f})" for e, w in zip(rt.experts[layer][i], rt.weights[layer][i]))
        self.readout.setText(f'L{layer} token {i} "{tok}": {pairs}')
