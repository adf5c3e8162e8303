"""The diverging colour map of signed maps (a hybrid's implicit attention, issue 25): blue < 0 (white) < red,
from session.mixers' lookup table, so every view and the lesson draw the same scale."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg

from attn_explorer.session.mixers import diverging_lut


def diverging_colormap() -> pg.ColorMap:
    lut = diverging_lut()
    return pg.ColorMap(np.linspace(0.0, 1.0, len(lut)), lut)
