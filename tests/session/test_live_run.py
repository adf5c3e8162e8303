"""Issue 24 C: a long (lazy) run's maps as they are computed. Each layer's heads reach the grid as soon as that
layer is done, before the forward ends; the run so far answers for its finished layers; Stop keeps them, marked
"incomplete: layers 0–k of L"."""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("transformers")

from attn_explorer.errors import UserError  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = ("The capital of France is Paris. Attention lets every token look at the tokens before it. "
        "A small model with random weights still attends to something: often the first token.")
LAYERS = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import attn_explorer as ax

    folder = make_llama_folder(tmp_path_factory.mktemp("llama") / "llama", num_hidden_layers=LAYERS)
    return ax.load_model(str(folder), device="cpu")


def test_the_first_layers_cells_arrive_before_the_forward_ends(model):
    from attn_explorer.session.jobs import parse_layers, run_job
    from attn_explorer.session.live_run import incomplete

    events = []
    ran = run_job(model, TEXT, {"lazy": True},
                  progress=lambda f, msg: events.append(("layer", parse_layers(msg)[0])),
                  partial=lambda part: events.append(("part", part)))
    parts = [e[1] for e in events if e[0] == "part"]
    assert [p.done for p in parts] == list(range(1, LAYERS + 1)) and parts[0].total == LAYERS
    first = next(i for i, e in enumerate(events) if e[0] == "part")
    last_layer = max(i for i, e in enumerate(events) if e[0] == "layer")
    assert first < last_layer, "layer 0's cells came only after the forward"
    assert events[first + 1] == ("layer", 1)  # sent as layer 0 ends, before the forward reports it
    one = parts[0].result
    assert one.is_lazy and one.num_tokens == ran.result.num_tokens and one.tokens == ran.result.tokens
    assert incomplete(one) == f"incomplete: layers 0–0 of {LAYERS}"
    r = ran.result
    c = one.display.cell
    for h in range(model.info.num_heads):  # layer 0's cells: exactly its heads pooled, as the finished run has them
        np.testing.assert_array_equal(one.display.weights[:c, h * c:(h + 1) * c], r.attention(0, h, pool=c))
        np.testing.assert_array_equal(one.attention(0, h, rows=3), r.attention(0, h, rows=3))
    assert np.isnan(one.display.weights[c:]).all()  # layers still to come: blank
    with pytest.raises(UserError, match="layer 1 has not been computed"):
        one.attention(1, 0, pool=4)
    # the finished run comes with the whole mosaic: the grid's lane has nothing to fill in
    assert r.display is not None and not np.isnan(r.display.weights).any() and incomplete(r) == ""
    np.testing.assert_array_equal(r.display.weights, parts[-1].result.display.weights)


def test_a_reused_prefix_run_sends_no_parts(model):
    from attn_explorer.session.jobs import run_job

    run_job(model, TEXT, {"lazy": True})
    parts = []
    ran = run_job(model, TEXT + " More", {"lazy": True}, partial=parts.append)
    assert ran.result.reuse.startswith("reused") and parts == [] and ran.result.display is None


def test_stop_keeps_the_finished_layers_marked_incomplete(qtbot, model, monkeypatch):
    from attn_explorer.api import model as api_model
    from attn_explorer.core import progress
    from attn_explorer.session.jobs import Loaded
    from attn_explorer.session.live_run import incomplete
    from attn_explorer.session.state import SessionState

    monkeypatch.setattr(api_model, "DENSE_MAX_BYTES", 0)  # the window's runs keep q and k
    plain = progress.layer_done

    def slow(*a, **kw):  # 0.4 s a layer: a long run in miniature
        time.sleep(0.4)
        plain(*a, **kw)

    monkeypatch.setattr(progress, "layer_done", slow)
    st = SessionState(loader=lambda *a, **kw: Loaded(model=model, info=model.info), device="cpu")
    st.inputs.text = ""
    shown = []
    st.attention_ready.connect(shown.append)
    try:
        st.load_model("tiny")
        qtbot.waitUntil(lambda: st.info is not None and not st.busy, timeout=20000)
        st.set_text(TEXT)
        qtbot.waitUntil(lambda: st.result is not None and incomplete(st.result) != "", timeout=20000)
        assert st.busy  # on screen while the forward still runs
        st.stop_run()
        qtbot.waitUntil(lambda: not st.busy, timeout=5000)
        qtbot.wait(300)
        r = st.result
        k = r.lazy.done
        assert 1 <= k < LAYERS and incomplete(r) == f"incomplete: layers 0–{k - 1} of {LAYERS}"
        assert r.attention(0, 0, pool=8).shape == (8, 8)
        with pytest.raises(UserError, match="has not been computed"):
            r.attention(LAYERS - 1, 0, pool=8)
        assert all(incomplete(x) for x in shown)  # nothing whole arrived: the run was stopped
    finally:
        st.shutdown()
