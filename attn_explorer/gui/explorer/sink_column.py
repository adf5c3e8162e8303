"""gpt-oss's learned sinks on a heatmap: the share of each query row its head's sink takes, drawn as a
column of its own, labelled "sink", left of key 0 (at x in [-1, 0), so the keys keep their places).

Each row of a model with sinks sums to 1 - its sink share over the real keys (RunResult.attentions, as
transformers returns them); the column shows the rest, coloured on the map's own scale
(session.long_view.sink_colours). Models without sinks draw nothing and the map starts at key 0 as before.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF

from attn_explorer.gui.widgets.heatmap import TokenAxis, colormap
from attn_explorer.maths import LOG_FLOOR
from attn_explorer.session.long_view import sink_colours

SINK_LABEL = "sink"


class SinkColumn:
    """The sink column of one plot: its image, its axis label and what the pointer over it reads."""

    def __init__(self, plot: pg.PlotItem, axis: TokenAxis):
        self.plot, self.axis = plot, axis
        self.image = pg.ImageItem(axisOrder="row-major")
        plot.addItem(self.image)
        self.values: np.ndarray | None = None  # (R,) the shown rows' sink shares, or None: no sink column

    @property
    def width(self) -> int:
        """Map units left of key 0 the column takes: 1 with a sink, else 0."""
        return 0 if self.values is None else 1

    def set(self, values: np.ndarray | None) -> None:
        self.values = None if values is None else np.asarray(values, dtype=np.float32)
        self.axis.lead_label = SINK_LABEL if self.values is not None else None
        self.axis.picture = None
        self.axis.update()
        if self.values is None:
            self.image.clear()

    def paint(self, matrix: np.ndarray | None, mode: str, log: bool, cmap: str, levels=None):
        """Colour the column like the map (matrix: the dense map drawn, or None for a long input's pooled view,
        where `levels` are the painted map's). Returns the map's Scaled (None without a matrix or a sink)."""
        if self.values is None:
            return None
        scaled, v = sink_colours(self.values, matrix, mode, log)
        lv = scaled.levels if scaled is not None else (levels or ((LOG_FLOOR, 0.0) if log else (0.0, 1.0)))
        self.image.setLookupTable(colormap(cmap).getLookupTable(0.0, 1.0, 256))
        self.image.setImage(v[:, None], levels=lv, autoLevels=False)
        self.image.setRect(QRectF(-1, 0, 1, len(v)))
        return scaled

    def hovered(self, scene_pos, rows: list[str]) -> str | None:
        """`query "it" → sink: 0.41 ...` when the pointer is over the column, else None."""
        if self.values is None or not self.plot.vb.sceneBoundingRect().contains(scene_pos):
            return None
        p = self.plot.vb.mapSceneToView(scene_pos)
        i = int(np.floor(p.y()))
        if not (-1 <= p.x() < 0 and 0 <= i < len(self.values)):
            return None
        tok = rows[i] if i < len(rows) else str(i)
        v = float(self.values[i])
        return f'query "{tok}" → sink: {v:.3f} (the head\'s learned sink; the keys share the other {1 - v:.3f})'
