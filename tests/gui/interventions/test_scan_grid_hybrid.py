"""Issue 25 on the Switch-off page's scan grid: a hybrid's narrower layers have fewer heads than the widest (a tiny
Granite 4 hybrid: Mamba-2 layers of 4 heads beside an attention layer of 6). Scan.exists marks the heads that are
real; the grid greys the others (not the white of "no effect"), the caption says so, and a click on one opens
nothing."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt

pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis.interventions import ablation_scan  # noqa: E402
from attn_explorer.gui.interventions.scan_view import ScanResults  # noqa: E402
from tests.hub.test_parity_mamba_hybrids import CASES  # noqa: E402
from tests.hub.test_parity_rotary_families import make_folder  # noqa: E402

TEXT = "The capital of France is Paris. The capital of Italy is"


def _click(qtbot, canvas, scene_pos):
    pt = canvas.mapFromScene(scene_pos)
    qtbot.mouseClick(canvas.viewport(), Qt.LeftButton, pos=QPoint(int(pt.x()), int(pt.y())))


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("granite4")
    make_folder(folder, "granite4", cases={"granite4": CASES["granite4"]})
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.layer_heads == (4, 6, 4)
    return ablation_scan(m, TEXT)


def test_absent_heads_are_grey_said_in_the_caption_and_not_clickable(qtbot, scan):
    assert scan.values.shape == (3, 6) and not scan.exists[0, 5] and scan.exists[1, 5]
    view = ScanResults()
    qtbot.addWidget(view)
    view.resize(640, 360)
    view.show()
    caption = view.draw(scan)
    shade = view.absent.image  # (L, H, 4) RGBA over the effect: opaque grey where the layer has no such head
    assert shade.shape == (3, 6, 4)
    np.testing.assert_array_equal(shade[..., 3] > 0, ~scan.exists)
    grey = shade[0, 5, :3].astype(int)
    assert grey.min() == grey.max() and 0 < grey[0] < 255  # grey, not the white of effect 0
    assert "grey" in caption.lower() and f"{int((~scan.exists).sum())} cells" in caption and "no such head" in caption, caption
    opened = []
    view.cell_opened.connect(lambda *a: opened.append(a))
    _click(qtbot, view.canvas, view.centre(0, 5))  # layer 0 (Mamba-2, 4 heads) has no head 5
    _click(qtbot, view.canvas, view.centre(2, 4))
    assert opened == []
    _click(qtbot, view.canvas, view.centre(1, 5))  # the attention layer's head 5 is real: it opens
    assert opened == [(1, 5)]


def test_a_full_grid_has_no_grey_and_no_word_of_it(qtbot, scan):
    from dataclasses import replace

    full = replace(scan, exists=np.ones_like(scan.exists))
    view = ScanResults()
    qtbot.addWidget(view)
    caption = view.draw(full)
    assert not (view.absent.image[..., 3] > 0).any() and "grey" not in caption.lower()
