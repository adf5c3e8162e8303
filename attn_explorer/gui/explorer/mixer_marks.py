"""A hybrid model's layers in the grid (issue 25 B): each recurrent layer's heads drawn over the softmax mosaic on
a diverging scale centred at 0 (blue negative, white 0, red positive; each layer scaled to its largest |A|), with
its own colour bar labelled "implicit attention (Gated DeltaNet)" or "(Mamba-2)"; the padded heads of a narrower
layer light grey (absent, not zero attention). The numbers come from session.mixers (NumPy)."""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF

from attn_explorer.gui.widgets.diverging import diverging_colormap
from attn_explorer.session.mixers import (ABSENT, MIXER_LABELS, grid_overlay, head_exists, is_recurrent,
                                         signed_without_specials)

__all__ = ["MixerOverlay", "diverging_colormap", "grid_note"]


class MixerOverlay:
    """The recurrent rows' image over a grid's mosaic, and their colour bar (hidden for a softmax-only model)."""

    def __init__(self, plot: pg.PlotItem):
        self.image = pg.ImageItem(axisOrder="row-major")
        plot.addItem(self.image)  # added right after the softmax mosaic: over it, under the separators
        self.bar = pg.ColorBarItem(values=(-1, 1), colorMap=diverging_colormap(), interactive=False, width=14)
        self.bar.axis.enableAutoSIPrefix(False)
        plot.layout.addItem(self.bar, 2, 6)
        self.bar.hide()
        self.rgba: np.ndarray | None = None  # what is drawn (tests)
        self.label = ""  # the bar's title

    def paint(self, attentions: np.ndarray | None, info, grid, encoder: bool, special=None) -> None:
        """Draw the recurrent rows and the absent heads of `attentions` (L, H, N, N) in the grid's cells."""
        rgba = None
        if encoder and grid is not None and info is not None and not isinstance(attentions, np.ndarray):
            # a long (lazy) run kept no maps: colour the overview's pooled cells themselves (issue 25)
            attentions, special = mosaic_cells(grid), None
        if encoder and attentions is not None and grid is not None and info is not None:
            if getattr(grid, "hidden_specials", False) and special is not None:  # as the mosaic: specials out
                attentions = signed_without_specials(attentions, special)
            rgba = grid_overlay(attentions, info, grid.cell, getattr(grid, "cell_cols", 0))
        self.show(rgba, QRectF(0, 0, grid.heads, grid.layers), info)

    def show(self, rgba: np.ndarray | None, rect: QRectF, info) -> None:
        """Draw an overlay made by session.mixers (None: nothing) over `rect` of the plot."""
        self.rgba = rgba
        if rgba is None:
            self.image.clear()
            self.image.hide()
            self.bar.hide()
            return
        self.image.setImage(rgba, autoLevels=False)
        self.image.setRect(rect)
        self.image.show()
        kinds = sorted({k for k in info.mixers if k != "softmax"})
        self.label = " / ".join(MIXER_LABELS.get(k, k) for k in kinds) + " ÷ its layer's max |A|"
        self.bar.axis.setLabel(self.label)
        self.bar.show() if kinds else self.bar.hide()


def mosaic_cells(grid) -> np.ndarray:
    """A GridImage's mosaic back as (L, H, c, c_cols) cells (each head's pooled map)."""
    c, cc = grid.cell, getattr(grid, "cell_cols", 0) or grid.cell
    return np.asarray(grid.weights, np.float32).reshape(grid.layers, c, grid.heads, cc).transpose(0, 2, 1, 3)


def grid_note(info, layers: int, heads: int) -> str:
    """The grid header's sentence on a hybrid model's rows ("" for a softmax-only model)."""
    mixers = tuple(getattr(info, "mixers", ()) or ())
    rec = [l for l in range(min(layers, len(mixers))) if is_recurrent(info, l)]
    absent = sum(1 for l in range(layers) for h in range(heads) if not head_exists(info, l, h))
    parts = []
    if rec:
        names = sorted({MIXER_LABELS.get(mixers[l], mixers[l]) for l in rec})
        parts.append(f"Rows marked {' / '.join(sorted({_short(mixers[l]) for l in rec}))} are recurrent: their "
                     f"{', '.join(names)} is signed (blue &lt; 0 &lt; red, white = 0), not probabilities")
    if absent:
        parts.append(f"grey cells: {html.escape(ABSENT)}")
    return (" " + "; ".join(parts) + ".") if parts else ""


def _short(kind: str) -> str:
    from attn_explorer.session.mixers import MIXER_SHORT
    return MIXER_SHORT.get(kind, kind)
