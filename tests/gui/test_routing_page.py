"""The Routing page on a tiny random Qwen3-MoE (MoE, dense, MoE layers): a layer × token grid coloured by each
token's top expert, grey for the dense layer, the hover read-out naming every chosen expert and its weight, a
redraw with each new run (the run's own routing), and one line instead of the grid for a dense model."""
from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from attn_explorer.gui.analysis.routing import DENSE_GREY, expert_colour, routing_image  # noqa: E402

TEXT = "The capital of France is Paris. The capital of Italy is Rome."


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    from tests.hub.test_parity_moe import make_folder
    folder = tmp_path_factory.mktemp("qwen3_moe-dense")
    make_folder(folder, "qwen3_moe-dense")
    return str(folder)


def _left_labels(plot) -> list[str]:
    return list(plot.getAxis("left")._labels)


def test_expert_colours_are_apart_and_dense_is_grey():
    colours = {expert_colour(e) for e in range(128)}
    assert len(colours) == 128 and DENSE_GREY not in colours
    img = routing_image(np.array([[3, -1], [0, 3]]))
    assert tuple(img[0, 1]) == DENSE_GREY and tuple(img[0, 0]) == expert_colour(3) == tuple(img[1, 1])


def test_the_grid_shows_each_tokens_top_expert(make_window, qtbot, moe_folder):
    w = make_window(model=moe_folder, text=TEXT, view="routing")
    page = w.pages["routing"]
    qtbot.waitUntil(lambda: page.shown is not None, timeout=30000)
    r = w.state.result
    rt, tokens, top = page.shown
    assert rt is r.routing and tokens == list(r.tokens)
    img = page.image.image
    assert img.shape == (3, len(r.tokens), 3) and (img[1] == DENSE_GREY).all()  # layer 1 is dense
    for layer in (0, 2):
        j = np.argmax(rt.weights[layer], axis=1)
        want = rt.experts[layer][np.arange(len(tokens)), j]
        assert np.array_equal(top[layer], want)
        assert all(tuple(img[layer, i]) == expert_colour(int(e)) for i, e in enumerate(want))
    assert _left_labels(page.plot) == ["L0", "L1 dense", "L2"]
    text = page.caption.text()
    assert "of 6 experts" in text and "1 dense layer" in text and "Most used" in text
    assert page.stack.currentWidget() is page.stack.canvas


def test_hover_reads_out_every_chosen_expert(make_window, qtbot, moe_folder):
    w = make_window(model=moe_folder, text=TEXT, view="routing")
    page = w.pages["routing"]
    qtbot.waitUntil(lambda: page.shown is not None, timeout=30000)
    rt = w.state.result.routing
    qtbot.waitUntil(lambda: page.plot.vb.sceneBoundingRect().width() > 50)
    page._hovered(page.plot.vb.mapViewToScene(__import__("pyqtgraph").Point(4.5, 2.5)))  # layer 2, token 4
    want = ", ".join(f"expert {int(e)} ({wt:.3f})" for e, wt in zip(rt.experts[2][4], rt.weights[2][4]))
    assert page.readout.text().startswith("L2 token 4 ") and want in page.readout.text()
    assert page.readout.text().count("expert ") == 3  # k = 3
    page._hovered(page.plot.vb.mapViewToScene(__import__("pyqtgraph").Point(1.5, 1.5)))
    assert "dense layer" in page.readout.text()


def test_a_new_run_redraws_with_its_own_routing(make_window, qtbot, moe_folder):
    w = make_window(model=moe_folder, text=TEXT, view="routing")
    page = w.pages["routing"]
    qtbot.waitUntil(lambda: page.shown is not None, timeout=30000)
    first = page.shown[0]
    w.state.set_text("Short one.")
    qtbot.waitUntil(lambda: page.shown is not None and page.shown[0] is not first, timeout=30000)
    assert page.shown[0] is w.state.result.routing and page.image.image.shape[1] == w.state.result.num_tokens


def test_a_dense_model_gets_one_line(make_window, qtbot):
    w = make_window(model="textbook", text="the cat sat on the mat", view="routing")
    page = w.pages["routing"]
    qtbot.waitUntil(lambda: page.stack.currentWidget() is page.stack.placeholder
                    and "dense" in page.stack.placeholder.text(), timeout=30000)
    assert page.shown is None and "no routing to show" in page.stack.placeholder.text()
    assert "\n" not in page.stack.placeholder.text()


def test_a_reopened_run_shows_its_routing(make_window, qtbot, moe_folder, tmp_path):
    import attn_explorer as ax
    from attn_explorer.files import save_npz
    r = ax.load_model(moe_folder, device="cpu").run(TEXT)
    path = save_npz(r, tmp_path / "moe.npz")
    w = make_window(model="textbook", text="the cat sat", view="routing")
    page = w.pages["routing"]
    assert w.open_saved_run(str(path))
    qtbot.waitUntil(lambda: page.shown is not None and page.shown[1] == list(r.tokens), timeout=30000)
    assert np.array_equal(page.shown[2], r.routing.top()[0])
