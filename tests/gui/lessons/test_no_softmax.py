"""Lesson page "no-softmax": both maps drawn (the softmax's 0..1, the DeltaNet's on the diverging scale centred at 0,
labelled), the random weights said, the decay plot follows the slider, the cost table, the Cost page's linear
variant named, a bad sentence refused in its one line."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.session.mixers import diverging_lut

LESSON = "no-softmax"
SIZE = (1100, 900)


def test_both_maps_side_by_side(page, settle):
    c = page.result
    assert c is not None and c.tokens[1] == "animal"
    np.testing.assert_array_equal(page.soft_img.image, c.softmax.astype(np.float32))
    np.testing.assert_array_equal(page.delta_img.image, c.deltanet.astype(np.float32))
    assert page.soft_bar.levels() == pytest.approx((0.0, 1.0))
    lo, hi = page.delta_bar.levels()
    assert lo == pytest.approx(-hi) and hi == pytest.approx(float(np.abs(c.deltanet).max()))
    lut = page.delta_bar.colorMap().getLookupTable(0.0, 1.0, len(diverging_lut()), alpha=False)
    np.testing.assert_array_equal(lut, diverging_lut())  # the views' diverging scale, white at 0
    assert "implicit attention (Gated DeltaNet)" in page.delta_bar.axis.labelText
    note = page.maps_note.text()
    assert "Untrained (random weights)" in note and "negative" in note and "do not apply" in note
    assert "random, seeded weights" in page.findChildren(type(page.maps_note))[0].text()


def test_the_decay_slider_moves_the_reach(page, settle):
    page.fixed_beta.setChecked(True)
    page.decay.setValue(0.3)
    settle(page)
    c = page.result
    assert c.decay == pytest.approx(0.3) and np.ptp(c.beta) == 0
    items = page.decay_plot.getPlotItem().listDataItems()
    np.testing.assert_allclose(items[1].yData, 0.3 ** c.distance)
    np.testing.assert_allclose(items[0].yData, c.last_row)
    assert (items[0].yData <= items[1].yData + 1e-9).all()  # under the bound (β = 1 here)
    assert "Past about" in page.decay_note.text()
    page.decay.setValue(0.95)
    settle(page)
    assert "about 58 tokens back" in page.decay_note.text()  # ln 0.05 / ln 0.95, past this sentence
    page.decay.setValue(1.0)
    settle(page)
    assert "With no decay" in page.decay_note.text()


def test_the_cost_table_and_the_bridge(page):
    rows = page.cell_texts()
    assert [r[0] for r in rows] == ["1,024", "8,192", "32,768", "131,072"]
    assert rows[0][4] == rows[-1][4]  # the state's memory does not grow
    assert rows[0][2] != rows[-1][2]  # the KV cache does
    assert "Cost" in page.bridge.text() and "linear" in page.bridge.text() and "O(n·d²)" in page.bridge.text()


def test_a_bad_sentence_is_one_line(page, settle):
    page.text.setText("   ")
    page.text.editingFinished.emit()
    settle(page)
    assert page.result is None and "at least one word" in page.message.text()
