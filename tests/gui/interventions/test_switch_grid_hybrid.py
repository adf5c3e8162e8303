"""Issue 25 on the Switch-off page's head grid: a hybrid's narrower layer has fewer heads than the widest (layer_heads
(4, 6, 4)). The grid greys the heads a layer does not have, and a click on one switches nothing (before, it switched
the cell on the grid and the run then refused "no head L0 H5")."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPoint, Qt

from attn_explorer.gui.interventions.switches import ABSENT, HeadSwitches


def _click(qtbot, canvas, scene_pos):
    pt = canvas.mapFromScene(scene_pos)
    qtbot.mouseClick(canvas.viewport(), Qt.LeftButton, pos=QPoint(int(pt.x()), int(pt.y())))


def test_absent_heads_are_grey_and_switch_nothing(qtbot):
    grid = HeadSwitches()
    qtbot.addWidget(grid)
    grid.resize(300, 300)
    grid.show()
    grid.draw(3, 6, {(1, 5)}, layer_heads=(4, 6, 4))
    drawn = grid.image.image
    assert drawn[0, 4] == ABSENT and drawn[2, 5] == ABSENT and drawn[1, 5] == 1 and drawn[1, 0] == 0
    assert int((drawn == ABSENT).sum()) == 4
    toggled = []
    grid.toggled.connect(lambda *a: toggled.append(a))
    _click(qtbot, grid, grid.centre(0, 5))
    _click(qtbot, grid, grid.centre(2, 4))
    assert toggled == []
    _click(qtbot, grid, grid.centre(1, 4))
    assert toggled == [(1, 4)]


def test_a_model_without_layer_heads_has_every_head(qtbot):
    grid = HeadSwitches()
    qtbot.addWidget(grid)
    grid.draw(2, 3, set())
    assert not np.any(grid.image.image == ABSENT)
