"""The window at a long input: the one-head map pooled to the screen and asked again at full resolution on
zoom and pan, the selected query's row as a strip over every key, the colour scales and their label, "Go to
token", the grid's overview filled in from its lane, nothing stale after a pan or a new run, and no torch on
the GUI thread in any of it.

A tiny seeded model (the textbook one, 2 layers × 4 heads) on a 500-token text; `long_view.WINDOWED_FROM` is
lowered so this dense result is drawn the way a long input is (through the lanes, never from the whole map).
"""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.session import long_view

WORDS = "the cat sat on the mat because it was warm and the dog ran far away from home".split()
N = 500
TEXT = " ".join(WORDS[i % len(WORDS)] for i in range(N - 1)) + " zebra"  # one word that occurs once, last


@pytest.fixture
def long_window(make_window, qtbot, monkeypatch):
    """The head page at 1024×700 on the 500-token text, drawn windowed, its whole-map base on screen."""
    monkeypatch.setattr(long_view, "WINDOWED_FROM", 64)
    w = make_window(model="textbook", text=TEXT, view="head")
    w.resize(1024, 700)
    hv = w.head_view
    qtbot.waitUntil(lambda: hv.long and hv.long_map.base is not None and not w.state.busy and _lanes_idle(w.state)
                    and hv.long_map.base.ask.cells == hv.long_map.visible_ask().cells, timeout=30000)
    return w


def _lanes_idle(state) -> bool:
    return not any(state.job_busy(k) for k in (long_view.WINDOW_LANE, long_view.STRIP_LANE, "long-window:whole"))


def _window_on_screen(hv) -> bool:
    """The window answered for what the head page shows now is the one drawn."""
    return hv.long_map.window is not None and hv.long_map.window.ask == hv.long_map.visible_ask()


def test_the_whole_map_is_pooled_to_the_screen_and_zoom_asks_again_at_full_resolution(long_window, qtbot):
    w = long_window
    st, hv = w.state, w.head_view
    r = st.result
    assert r.num_tokens == N and hv.matrix is None  # never the whole map in the GUI
    base = hv.long_map.base
    assert base.ask.rows == (0, N) and base.ask.cols == (0, N)
    assert base.ask.cells[0] < N and base.pooled  # fewer pixels than rows: pooled
    np.testing.assert_array_equal(base.values, r.attention(st.layer, st.head, pool=base.ask.cells))
    assert not hv.left_axis.labels_every_token()
    assert all(t.isdigit() for _, t in hv.left_axis.drawn_labels())  # positions while crowded, not tokens

    hv.plot.setRange(xRange=(120, 150), yRange=(200, 212), padding=0)  # as a wheel zoom leaves it
    qtbot.waitUntil(lambda: _window_on_screen(hv), timeout=10000)
    win = hv.long_map.window
    a, b = win.ask.rows
    c, d = win.ask.cols
    assert not win.pooled and (a, b, c, d) == (200, 212, 120, 150)
    want = r.attention(st.layer, st.head, rows=(a, b), cols=(c, d))
    np.testing.assert_array_equal(hv.image.image, want)  # the image drawn is the exact window
    assert hv.left_axis.labels_every_token()  # room for one a line: every token named
    assert [t for _, t in hv.left_axis.drawn_labels()][:3] == [r.tokens[200], r.tokens[201], r.tokens[202]]
    i, j = 207, 130
    assert hv.describe_long(i, j) == (f'query "{r.tokens[i]}" ({i}) → key "{r.tokens[j]}" ({j}): '
                                      f"{want[i - a, j - c]:.3f}")

    hv.plot.setRange(xRange=(300, 330), yRange=(300, 312), padding=0)  # a drag pan
    assert hv.readout.text().startswith("Hover over the map")  # it described a cell of the old window
    qtbot.waitUntil(lambda: hv.long_map.window.ask.rows == (300, 312) and hv.long_map.window.ask.cols == (300, 330),
                    timeout=10000)
    np.testing.assert_array_equal(hv.image.image, r.attention(st.layer, st.head, rows=(300, 312), cols=(300, 330)))


def test_an_answer_for_another_window_head_or_run_is_dropped(long_window, qtbot):
    w = long_window
    st, hv = w.state, w.head_view
    hv.plot.setRange(xRange=(10, 40), yRange=(10, 34), padding=0)
    qtbot.waitUntil(lambda: _window_on_screen(hv), timeout=10000)
    old_run = st.result
    stale_ask = long_view.WindowAsk(long_view.result_tag(old_run), st.layer, st.head, (50, 74), (50, 80), (24, 30))
    stale = long_view.window_job(old_run, stale_ask)  # a pan the view has since left
    shown = hv.long_map.window
    hv.long_map.window_arrived(stale)
    assert hv.long_map.window is shown  # not the window on screen: dropped

    with qtbot.waitSignal(st.selection_changed):
        st.select(head=(st.head + 1) % 4)
    other_head = long_view.window_job(old_run, long_view.WindowAsk(stale_ask.tag, st.layer, (st.head + 3) % 4,
                                                                   shown.ask.rows, shown.ask.cols, shown.ask.cells))
    hv.long_map.window_arrived(other_head)
    assert hv.long_map.window is None or hv.long_map.window.ask.head == st.head  # the old head's answer never shows
    qtbot.waitUntil(lambda: _window_on_screen(hv), timeout=10000)
    assert hv.long_map.window.ask.head == st.head

    with qtbot.waitSignal(st.attention_ready, timeout=30000):  # a new run (another text)
        st.set_text(TEXT.replace("zebra", "giraffe"))
    tag = long_view.result_tag(st.result)
    qtbot.waitUntil(lambda: hv.long_map.base is not None and hv.long_map.base.ask.tag == tag, timeout=10000)
    before = hv.long_map.window
    hv.long_map.window_arrived(long_view.window_job(old_run, long_view.WindowAsk(
        long_view.result_tag(old_run), st.layer, st.head, (0, 24), (0, 30), (24, 30))))
    assert hv.long_map.window is before  # the old run's answer is dropped
    assert hv.strip.strip is None or hv.strip.strip.tag == long_view.result_tag(st.result)


def test_the_strip_follows_the_query_over_every_key(long_window, qtbot):
    w = long_window
    st, hv = w.state, w.head_view
    r = st.result
    for q in (7, 321, N - 1):
        st.set_query(q)
        qtbot.waitUntil(lambda: hv.strip.strip is not None and hv.strip.strip.query == q, timeout=10000)
        s = hv.strip.strip
        row = r.attention(st.layer, st.head, rows=q)
        assert s.total == N and s.values.shape[0] <= N
        from attn_explorer.maths import pool_edges

        edges = pool_edges(N, s.values.shape[0])
        np.testing.assert_array_equal(s.values, np.maximum.reduceat(row, edges[:-1]))
        assert s.top[0] == (int(np.argmax(row)), pytest.approx(float(row.max())))
        assert f'query {q} "{r.tokens[q]}"' in hv.strip.readout.text()
    st.select(layer=1, head=2)  # another head: its own strip, never the old one
    assert hv.strip.strip is None
    qtbot.waitUntil(lambda: hv.strip.strip is not None, timeout=10000)
    assert (hv.strip.strip.layer, hv.strip.strip.head, hv.strip.strip.query) == (1, 2, N - 1)
    # clicking a row of the map picks that query; the strip follows
    from attn_explorer.gui.widgets.heatmap import cell_centre

    hv.plot.setRange(xRange=(0, 40), yRange=(100, 130), padding=0)
    qtbot.waitUntil(lambda: _lanes_idle(st), timeout=10000)
    pos = hv.canvas.mapFromScene(cell_centre(hv.plot, 105, 3))
    from PySide6.QtCore import Qt

    qtbot.mouseClick(hv.canvas.viewport(), Qt.LeftButton, pos=pos)
    qtbot.waitUntil(lambda: st.query == 105, timeout=5000)
    qtbot.waitUntil(lambda: hv.strip.strip is not None and hv.strip.strip.query == 105, timeout=10000)


def test_go_to_token_by_number_or_word(long_window, qtbot):
    w = long_window
    st, hv = w.state, w.head_view
    hv.goto.setText("250")
    hv.goto.returnPressed.emit()
    assert st.query == 250
    (x0, x1), (y0, y1) = hv.plot.vb.viewRange()
    assert y0 <= 250 < y1 and x0 <= 250 < x1 and y1 - y0 <= 49
    assert 'token 250 "' in hv.goto_note.text()
    qtbot.waitUntil(lambda: _window_on_screen(hv) and not hv.long_map.window.pooled, timeout=10000)
    assert hv.left_axis.labels_every_token()
    assert hv.go_to("zebra") == N - 1 and st.query == N - 1  # the one occurrence, at the end
    assert hv.go_to("dog") == 12 and hv.go_to("dog") == 12 + len(WORDS)  # the next after the query each time
    assert hv.go_to("99999") is None and st.query == 12 + len(WORDS)
    assert "there is no token 99,999" in hv.goto_note.text()
    assert hv.go_to("unicorn") is None and 'no token "unicorn"' in hv.goto_note.text()


def test_find_token_rules():
    tokens = ["<s>", "ĠThe", "Ġcat", "▁sat", "cats", "Ġcat"]
    assert long_view.find_token(tokens, "cat") == 2
    assert long_view.find_token(tokens, "cat", after=2) == 5
    assert long_view.find_token(tokens, "cat", after=5) == 2  # wraps round
    assert long_view.find_token(tokens, "ats") == 4  # contained, when no token is the word
    assert long_view.find_token(tokens, "#3") == 3
    from attn_explorer.errors import UserError

    with pytest.raises(UserError, match="no token 6"):
        long_view.find_token(tokens, "6")


def test_colour_scales_with_a_sink_and_the_label_that_says_which_is_on(long_window, qtbot):
    a = np.full((4, 6), 0.02, np.float32)
    a[:, 0] = 0.9  # a sink column
    a[2, 3] = 0.05
    s = long_view.colour_scale(a, "weight", False)
    assert s.levels == (0.0, 1.0) and s.label == "weight" and np.array_equal(s.values, a)
    s = long_view.colour_scale(a, "row", False)
    np.testing.assert_allclose(s.values.max(axis=1), 1.0)
    assert "row" in s.label
    s = long_view.colour_scale(a, "clip", False)
    assert list(s.sinks) == [0] and np.isnan(s.values[:, 0]).all()  # the sink is left apart
    assert s.levels[1] == pytest.approx(np.percentile(a[:, 1:], 99)) and s.sink_share == pytest.approx(0.9)
    assert "sinks apart" in s.label

    w = long_window
    st, hv = w.state, w.head_view
    hv.plot.setRange(xRange=(0, 30), yRange=(0, 24), padding=0)
    qtbot.waitUntil(lambda: _window_on_screen(hv), timeout=10000)
    st.set_options(colour_scale="row")
    assert "row's max" in hv.scale_label.text() and "row's max" in hv.colorbar.axis.labelText
    np.testing.assert_allclose(np.nanmax(hv.image.image, axis=1), 1.0, rtol=1e-6)
    assert hv.scale_combo.currentData() == "row"
    st.set_options(colour_scale="clip")
    assert "99th pct" in hv.scale_label.text()
    values = hv.long_map.window.values
    top = np.percentile(values[:, np.setdiff1d(np.arange(30), long_view.sink_columns(values))], 99)
    assert hv.colorbar.levels()[1] == pytest.approx(top, rel=1e-5)
    st.set_options(colour_scale="weight")
    assert "Colour: <b>weight</b>" in hv.scale_label.text()


def test_short_inputs_keep_the_dense_map_and_get_the_strip_and_scales(make_window, qtbot):
    w = make_window(model="textbook", text="the cat sat on the mat because it was warm", view="head")
    st, hv = w.state, w.head_view
    qtbot.waitUntil(lambda: hv.matrix is not None)
    assert not hv.long
    st.set_query(3)
    assert hv.strip.strip.query == 3
    np.testing.assert_array_equal(hv.strip.strip.values, st.result.attentions[st.layer, st.head, 3])
    st.set_options(colour_scale="row")
    np.testing.assert_allclose(hv.image.image.max(axis=1), 1.0, rtol=1e-6)


# ------------------------------------------------------------------------------------------ a lazy run
class AlwaysLazy:
    """The textbook model, every run keeping q and k instead of its maps (Model.run(lazy=True)): a long
    input's run, at a size the test can also compute densely."""

    def __init__(self, model):
        self._model = model
        self.info = model.info

    def __getattr__(self, name):
        return getattr(self._model, name)

    def run(self, x, lazy=None, **kw):
        return self._model.run(x, lazy=True, **kw)


def _lazy_supported() -> bool:
    import inspect

    from attn_explorer.api.model import Model

    return "lazy" in inspect.signature(Model.run).parameters


def _window(qtbot, settings, text, lazy=True, view="head", model="textbook", image=None):
    """A window on `text` (or `image`) with a tiny model, every run lazy (r.attentions refuses) or as it is."""
    import argparse

    from attn_explorer.gui.window.app import build_window, get_qapp
    from attn_explorer.session.state import Loaded
    from tests.gui.conftest import cached_loader

    def loader(src, device="cpu", progress=None, want_image=False, **kw):
        base = cached_loader(src, device, progress, want_image)
        model = AlwaysLazy(base.model) if lazy else base.model
        return Loaded(model=model, info=base.info, builtins=base.builtins)

    get_qapp()
    args = argparse.Namespace(model=model, text=text, image=image, device="cpu", view=view, screenshot=None)
    w, st = build_window(args, settings=settings, loader=loader)
    qtbot.addWidget(w)
    w.resize(1024, 700)
    w.show()
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=60000)
    return w


@pytest.fixture
def lazy_window(qtbot, settings):
    """The window on the 500-token text with every run lazy (r.attentions refuses to be read)."""
    if not _lazy_supported():
        pytest.skip("Model.run(lazy=...) is not in this tree yet")
    w = _window(qtbot, settings, TEXT)
    yield w
    w.state.shutdown()


def test_a_lazy_run_on_the_explorer_pages_with_no_torch_on_the_gui_thread(lazy_window, qtbot):
    from tests.gui.lessons.test_gui_thread import TorchCalls

    w = lazy_window
    st, hv = w.state, w.head_view
    r = st.result
    assert r.is_lazy and r.display is not None  # its mosaic was filled in layer by layer as it ran (issue 24 C)
    dense = r.lazy  # the store: every check below compares with what it computes
    with TorchCalls() as calls:
        qtbot.waitUntil(lambda: hv.long and hv.long_map.base is not None, timeout=20000)
        hv.plot.setRange(xRange=(40, 70), yRange=(400, 412), padding=0)
        qtbot.waitUntil(lambda: _window_on_screen(hv), timeout=20000)
        assert hv.go_to("zebra") == N - 1
        qtbot.waitUntil(lambda: hv.strip.strip is not None and hv.strip.strip.query == N - 1, timeout=20000)
        qtbot.waitUntil(lambda: _window_on_screen(hv), timeout=20000)
        st.set_options(colour_scale="clip")
        w.show_page("grid")
        g = w.grid
        qtbot.waitUntil(lambda: g.last_image is not None and g.overview_state() == "", timeout=30000)
        assert not g.filling.isVisible()
        w.show_page("tokens")
        tv = w.token_view
        qtbot.waitUntil(lambda: tv.rows is not None, timeout=20000)
        assert "not drawn" in w.dk_panel.readout.text()
    assert not calls.calls, calls.report()

    win = hv.long_map.window
    np.testing.assert_allclose(win.values, dense.attention(st.layer, st.head, rows=win.ask.rows, cols=win.ask.cols),
                               atol=1e-7)
    np.testing.assert_allclose(hv.strip.strip.values.max(), dense.attention(st.layer, st.head, rows=N - 1).max())
    c = r.display.cell
    for layer, head in ((0, 0), (1, 3)):
        np.testing.assert_allclose(g.last_image[layer * c:(layer + 1) * c, head * c:(head + 1) * c],
                                   dense.attention(layer, head, pool=c), atol=1e-7)
    q = st.query
    np.testing.assert_allclose(tv.rows[st.layer * 4 + st.head], dense.attention(st.layer, st.head, rows=q), atol=1e-7)
    assert "kept: q, k and row statistics" in w.seq_panel.readout.text()


def test_the_n_slider_reaches_the_positions_when_q_and_k_fit_where_the_maps_do_not(qtbot, settings, monkeypatch):
    """1 MB to spare: the textbook model's maps would fit only 176 tokens (2 × 4 × n² × 4 B; the slider stopped
    there before), its q, k and row statistics far more than its 512 positions: the run reads all 512, and
    the slider reaches them. (A model that keeps its maps is cut to what they fit: tests/session/test_state.py.)"""
    if not _lazy_supported():
        pytest.skip("Model.run(lazy=...) is not in this tree yet")
    from attn_explorer.session import jobs

    monkeypatch.setattr(jobs, "memory_budget", lambda device: 1_000_000)
    text = " ".join(WORDS[i % len(WORDS)] for i in range(700))
    w = _window(qtbot, settings, text)
    try:
        st, sp = w.state, w.seq_panel
        qtbot.waitUntil(lambda: sp.slider.maximum() == 512, timeout=10000)
        assert st.result.num_tokens == 512 and st.fit_tokens > 512 and "reads at most 512" in st.cut_reason
        assert "cut to the first 512 of 700" in w.input_panel.current.text()
    finally:
        w.state.shutdown()


def test_a_text_file_of_any_size_is_cut_on_its_way_in_with_a_note(make_window, qtbot, tmp_path):
    w = make_window(model="textbook", text="the cat sat", view="head")
    st = w.state
    body = ("é " + " ".join(WORDS)) * 4000  # about 300 kB; a two-byte character at every cut
    big = tmp_path / "novel.txt"
    big.write_text(body, encoding="utf-8")
    with qtbot.waitSignal(st.attention_ready, timeout=30000):
        assert w.open_text_file(str(big))
    keep = st.info.max_positions * 32  # session.inputs.FILE_BYTES_PER_POSITION for each position
    assert body.startswith(st.text) and keep - 1 <= len(st.text.encode("utf-8")) <= keep
    assert "novel.txt has 0.3" in st.text_note and "went into the text box (textbook reads at most 512 tokens)" \
        in st.text_note
    qtbot.waitUntil(lambda: st.text_note in w.input_panel.current.text(), timeout=5000)
    assert "cut to the first 512 of" in w.input_panel.current.text()
    small = tmp_path / "short.txt"
    small.write_text("the dog ran far away", encoding="utf-8")
    with qtbot.waitSignal(st.attention_ready, timeout=30000):
        assert w.open_text_file(str(small))
    assert st.text == "the dog ran far away" and st.text_note == ""  # whole, and the old note is gone
    qtbot.waitUntil(lambda: "novel.txt" not in w.input_panel.current.text(), timeout=5000)


def test_the_overlay_draws_a_lazy_image_run_from_one_query_row_at_a_time(qtbot, settings, sample_path):
    """A large picture's run keeps no maps (DINOv2-S at 1036 px: 5,477 tokens): the overlay asks for the
    query's row in each head of the layer, never the maps, and a new query's heat replaces the old one."""
    if not _lazy_supported():
        pytest.skip("Model.run(lazy=...) is not in this tree yet")
    from attn_explorer.gui.widgets.overlay import blend, patch_heat
    from tests.gui.lessons.test_gui_thread import TorchCalls

    w = _window(qtbot, settings, None, model="textbook-vit", image=sample_path, view="overlay")
    try:
        st, ov = w.state, w.overlay
        r = st.result
        assert r.is_lazy and r.grid is not None
        q = r.patch_offset + 5
        with TorchCalls() as calls:
            qtbot.waitUntil(lambda: ov.big_rgb is not None, timeout=20000)
            st.set_query(q)
            assert ov.big_rgb is None and "Computing" in ov.caption.text()  # the old query's heat is gone
            qtbot.waitUntil(lambda: ov.big_rgb is not None, timeout=20000)
        assert not calls.calls, calls.report()
        heat = patch_heat(r.attention(st.layer, st.head, rows=q), r.grid, r.patch_offset)
        want = blend(r.image, heat, st.alpha, st.colormap, ov.smooth.isChecked(), st.log_scale)
        np.testing.assert_array_equal(ov.big_rgb, want)
        assert "patch row 0, col 5" in ov.caption.text()
    finally:
        w.state.shutdown()


def test_local_and_global_layers_are_marked_on_a_lazy_run(qtbot, settings, tmp_path, monkeypatch):
    """A tiny random Gemma 3 (two local layers with a 5-token window, then a global one), every run lazy and
    drawn windowed: the grid's rows and the one-head header say which layers are local, and a local layer's
    window is the band its mask allows (exactly what the store computes)."""
    if not _lazy_supported():
        pytest.skip("Model.run(lazy=...) is not in this tree yet")
    transformers = pytest.importorskip("transformers")
    import torch

    from tests.tiny_llama import train_tokenizer

    folder = tmp_path / "gemma3"
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(vocab_size=300, hidden_size=32, intermediate_size=37, num_attention_heads=4,
                                        num_key_value_heads=1, head_dim=8, max_position_embeddings=128,
                                        num_hidden_layers=3, sliding_window=5, sliding_window_pattern=3,
                                        attn_implementation="eager", bos_token_id=1, eos_token_id=2, pad_token_id=0)
    transformers.Gemma3ForCausalLM(cfg).eval().save_pretrained(folder, safe_serialization=True)
    train_tokenizer().save(str(folder / "tokenizer.json"))
    monkeypatch.setattr(long_view, "WINDOWED_FROM", 16)
    text = " ".join(WORDS[i % len(WORDS)] for i in range(40))
    w = _window(qtbot, settings, text, model=str(folder), view="grid")
    try:
        st, g, hv = w.state, w.grid, w.head_view
        assert st.result.is_lazy
        qtbot.waitUntil(lambda: g.last_image is not None and g.overview_state() == "", timeout=30000)
        labels = [t for _, t in g.plot.getAxis("left")._tickLevels[0]]
        assert labels == ["L0 · local 5", "L1 · local 5", "L2 · global"]
        w.show_page("head")
        st.select(layer=1, head=2)
        qtbot.waitUntil(lambda: "Layer 1 (local, window 5), head 2" in hv.title.text() and hv.long, timeout=10000)
        hv.plot.setRange(xRange=(10, 30), yRange=(12, 24), padding=0)
        qtbot.waitUntil(lambda: _window_on_screen(hv), timeout=10000)
        win = hv.long_map.window
        np.testing.assert_array_equal(win.values, st.result.attention(1, 2, rows=(12, 24), cols=(10, 30)))
        i, j = np.nonzero(win.values > 0)
        rows, cols = i + 12, j + 10
        assert ((cols <= rows) & (cols > rows - 5)).all()  # the local band: itself and the 4 tokens before
        st.select(layer=2)
        qtbot.waitUntil(lambda: "Layer 2 (global), head 2" in hv.title.text(), timeout=10000)
    finally:
        w.state.shutdown()


def test_a_zoom_that_settles_after_the_window_closed_starts_nothing(long_window, qtbot):
    """The view asks for its window 40 ms after a zoom; if the window was closed (the session shut down) in
    between, that ask started a job whose answer reached deleted widgets ('Internal C++ object (ImageItem)
    already deleted' in the next test). A session that was shut down starts no side job."""
    w = long_window
    st, hv = w.state, w.head_view
    hv.plot.setRange(xRange=(5, 35), yRange=(5, 17), padding=0)
    assert hv.long_map.timer.isActive()
    st.shutdown()
    hv.long_map.ask_window()  # the timer firing now
    assert not st.job_busy(long_view.WINDOW_LANE)
    assert st.submit(long_view.window_job, st.result, hv.long_map.visible_ask(), key="after", uses_model=False) is False
