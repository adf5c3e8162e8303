"""gpt-oss's learned sinks in the window (a tiny random gpt-oss folder): the head page draws each row's sink
share as its own column, "sink", left of key 0, reads it out on hover and in its header; the grid gives every
cell a sink column; the overview has a "learned sink" grid; models without sinks draw none."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF

pytest.importorskip("transformers")

from tests.hub.test_parity_gpt_oss import make_folder  # noqa: E402

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def gpt_oss_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt_oss_gui")
    make_folder(folder, "gpt_oss")
    return str(folder)


def test_the_head_page_draws_the_sink_column_left_of_the_keys(make_window, qtbot, gpt_oss_folder):
    w = make_window(model=gpt_oss_folder, text=TEXT, view="head")
    st, hv = w.state, w.head_view
    st.select(1, 3)
    qtbot.waitUntil(lambda: hv.sink.values is not None and hv._head is not None and hv._head[1:] == (1, 3))
    r = st.result
    np.testing.assert_allclose(hv.sink.values, r.sinks[1, 3], atol=1e-7)
    np.testing.assert_allclose(hv.matrix, r.attentions[1, 3], atol=0)
    np.testing.assert_allclose(hv.matrix.sum(-1) + hv.sink.values, 1.0, atol=1e-5)  # the keys get the rest
    assert hv.plot.vb.viewRange()[0][0] == pytest.approx(-1.0)  # the column sits at x in [-1, 0)
    assert hv.bottom_axis.drawn_labels()[0][1] == "sink"
    rect = hv.sink.image.mapRectToParent(hv.sink.image.boundingRect())
    assert rect.left() == pytest.approx(-1.0) and rect.right() == pytest.approx(0.0)
    assert "learned sink" in hv.title.text() and f"{float(r.sinks[1, 3].mean()):.0%}" in hv.title.text()
    q = 5
    hv._hovered(hv.plot.vb.mapViewToScene(QPointF(-0.5, q + 0.5)))
    assert hv.readout.text().startswith(f'query "{r.tokens[q]}" → sink: {float(r.sinks[1, 3, q]):.3f}')
    hv._hovered(hv.plot.vb.mapViewToScene(QPointF(0.5, q + 0.5)))  # key 0 is still key 0
    assert hv.readout.text().startswith(f'query "{r.tokens[q]}" → key "{r.tokens[0]}"')


def test_hiding_specials_renormalises_over_the_keys_and_the_sink(make_window, qtbot, gpt_oss_folder):
    from attn_explorer.gui.explorer.head_maps import with_sink
    from attn_explorer.session.stacks import stack_maps

    w = make_window(model=gpt_oss_folder, text=TEXT, view="head")
    r = w.state.result
    special = np.zeros(r.num_tokens, dtype=bool)
    special[0] = True  # as if the first token were special
    m = stack_maps(r)
    m = type(m)(m.stack, m.attentions, m.rows, m.cols, special, special)
    keep = np.arange(1, r.num_tokens)
    a, s = with_sink(m, r.sinks, 0, 2, True, None, keep)
    np.testing.assert_allclose(a.sum(-1) + s, 1.0, atol=1e-5)
    share = r.sinks[0, 2, keep] / (r.sinks[0, 2, keep] + r.attentions[0, 2][np.ix_(keep, keep)].sum(-1))
    np.testing.assert_allclose(s, share, atol=1e-6)


def test_the_grid_and_the_overview_show_the_sinks(make_window, qtbot, gpt_oss_folder):
    w = make_window(model=gpt_oss_folder, text=TEXT, view="grid")
    st = w.state
    r = st.result
    L, H, N, _ = r.attentions.shape
    qtbot.waitUntil(lambda: st.grid_image is not None)
    g = st.grid_image
    assert g.cell == N and g.cell_cols == N + 1
    np.testing.assert_allclose(g.weights[N:2 * N, 2 * (N + 1)], r.sinks[1, 2], atol=1e-7)  # layer 1, head 2
    np.testing.assert_allclose(g.weights[N:2 * N, 2 * (N + 1) + 1:3 * (N + 1)], r.attentions[1, 2], atol=1e-7)
    assert "<b>sink</b>" in w.grid.title.text()
    w.show_page("overview")
    page = w.pages["overview"]
    qtbot.waitUntil(lambda: page.stats is not None and page.learned is not None, timeout=30000)
    np.testing.assert_allclose(page.learned, r.sinks.mean(-1), atol=1e-6)
    assert page.learned_plot is not None and "learned sinks take" in page.caption.text()
    assert "learned sink" in page.describe("entropy", 1, 2)


def test_a_long_gpt_oss_input_keeps_the_sink_column(make_window, qtbot, gpt_oss_folder):
    """A lazy run (no maps kept): the sinks still come with the run (from the kept lse), the head page's long
    map draws the column beside the pooled map."""
    import attn_explorer as ax

    w = make_window(model=gpt_oss_folder, text=TEXT, view="head")
    st, hv = w.state, w.head_view
    r = ax.load_model(gpt_oss_folder, device="cpu").run(TEXT, lazy=True)
    assert r.is_lazy and r.sinks is not None
    np.testing.assert_allclose(r.sinks, st.result.sinks, atol=1e-5)
    hv.long = True
    hv._draw_long(r, st.maps(r), 2, 1)
    np.testing.assert_allclose(hv.sink.values, r.sinks[2, 1], atol=0)
    assert hv.bottom_axis.lead_label == "sink" and hv.plot.vb.viewRange()[0][0] == pytest.approx(-1.0)


def test_no_sink_column_without_learned_sinks(make_window, qtbot):
    w = make_window(model="textbook", text="the cat sat on the mat", view="head")
    hv = w.head_view
    qtbot.waitUntil(lambda: hv.matrix is not None)
    assert w.state.result.sinks is None and hv.sink.values is None and hv.sink.width == 0
    assert hv.plot.vb.viewRange()[0][0] == pytest.approx(0.0)
    assert all(t != "sink" for _, t in hv.bottom_axis.drawn_labels())


def test_the_token_page_draws_each_heads_sink_column(make_window, qtbot, gpt_oss_folder):
    w = make_window(model=gpt_oss_folder, text=TEXT, view="tokens")
    st = w.state
    page = w.token_view
    st.set_query(7)
    qtbot.waitUntil(lambda: page.sink.values is not None and "token 7" in page.caption.text())
    r = st.result
    L, H = r.attentions.shape[:2]
    np.testing.assert_allclose(page.sink.values, r.sinks[:, :, 7].reshape(L * H), atol=0)
    np.testing.assert_allclose(page.rows.sum(-1) + page.sink.values, 1.0, atol=1e-5)
    assert page.bottom_axis.drawn_labels()[0][1] == "sink" and "learned <b>sink</b>" in page.caption.text()


def test_the_query_strip_says_what_the_sink_takes(make_window, qtbot, gpt_oss_folder):
    w = make_window(model=gpt_oss_folder, text=TEXT, view="head")
    st, hv = w.state, w.head_view
    st.set_query(6)
    qtbot.waitUntil(lambda: "query 6 " in hv.strip.readout.text())
    assert f"the sink takes {float(st.result.sinks[st.layer, st.head, 6]):.2f}" in hv.strip.readout.text()


def test_the_sink_is_coloured_on_the_maps_own_scale():
    """session.long_view.sink_colours: "weight" as is; "row" each row with its sink over their joint max; "clip"
    the map's own clip, a sink above it drawn at the top."""
    from attn_explorer.session.long_view import colour_scale, sink_colours

    a = np.array([[0.1, 0.0], [0.2, 0.3]], dtype=np.float32)
    s = np.array([0.9, 0.5], dtype=np.float32)
    scaled, v = sink_colours(s, a, "weight", False)
    np.testing.assert_allclose(v, s)
    np.testing.assert_allclose(scaled.values, a)
    scaled, v = sink_colours(s, a, "row", False)
    np.testing.assert_allclose(v, [1.0, 1.0])
    np.testing.assert_allclose(scaled.values, [[0.1 / 0.9, 0.0], [0.4, 0.6]], rtol=1e-6)
    scaled, v = sink_colours(s, a, "clip", False)
    assert scaled.levels == colour_scale(a, "clip", False).levels
    np.testing.assert_allclose(v, np.minimum(s, scaled.levels[1]))
