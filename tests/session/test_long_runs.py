"""Issue 24 D, without a window: a long run reports layer k of L while it runs, and a model switch, a new
edit or Stop ends it within a second (between layers: core.progress); the switch ends the old model's side
jobs too, those on its run's q and k (the long views' lanes) included."""
from __future__ import annotations

import time

import numpy as np
import pytest

from attn_explorer.api.result import ModelInfo, RunResult
from attn_explorer.core import progress as core_progress
from attn_explorer.session.jobs import Loaded
from attn_explorer.session.state import SessionState

LAYERS, LAYER_S = 200, 0.05  # a 10 s forward


class Deep:
    """A 'model' whose forward runs LAYERS layers of LAYER_S each, reporting them as BlockStack does."""

    def __init__(self, name: str, layers: int = LAYERS):
        self.info = ModelInfo(name=name, family="textbook", modality="text", num_layers=layers, num_heads=2,
                              hidden_size=8, max_positions=512, device="cpu", dtype="float32", trained=False)
        self.layers_run = 0
        self.ended_at: float | None = None

    def run(self, text, dk_scale=1.0, dk_layers=None, max_tokens=None):
        words = text.split()[:max_tokens]
        n = len(words)
        try:
            for i in range(self.info.num_layers):
                time.sleep(LAYER_S)
                self.layers_run += 1
                core_progress.layer_done(i + 1, self.info.num_layers, n)
        finally:
            self.ended_at = time.perf_counter()
        att = np.tril(np.ones((self.info.num_layers, 2, n, n), np.float32))
        att /= att.sum(-1, keepdims=True)
        return RunResult(attentions=att, tokens=words, special=np.zeros(n, bool), model=self.info.name,
                         dk_scale=dk_scale, forward_ms=1.0, total_tokens=n)


@pytest.fixture
def world(qtbot):
    models = {"deep": Deep("deep"), "small": Deep("small", 1)}

    def loader(src, device="cpu", progress=None, want_image=False):
        m = models[src or "deep"]
        return Loaded(model=m, info=m.info)

    st = SessionState(loader=loader, device="cpu")
    st.inputs.text = ""
    yield st, models
    st.shutdown()


def _start_long_run(qtbot, st, models):
    st.load_model("deep")
    qtbot.waitUntil(lambda: st.info is not None and st.info.name == "deep", timeout=10000)
    qtbot.waitUntil(lambda: not st.busy, timeout=30000)
    seen = []
    st.run_progressed.connect(lambda done, total, msg: seen.append((done, total, msg)))
    st.set_text("a long text of many words to follow")
    qtbot.waitUntil(lambda: len(seen) >= 3, timeout=10000)
    return seen


def test_a_long_run_says_which_layer_it_is_at(qtbot, world):
    st, models = world
    seen = _start_long_run(qtbot, st, models)
    done, total, msg = seen[-1]
    assert total == LAYERS and 1 <= done < LAYERS
    assert f"layer {done} of {LAYERS}" in msg and "8 tokens" in msg and "deep" in msg
    assert st.run_status()["layer"] == done and st.run_status()["elapsed_s"] > 0


def test_a_model_switch_stops_the_long_forward_within_a_second(qtbot, world):
    st, models = world
    _start_long_run(qtbot, st, models)
    deep = models["deep"]
    asked = time.perf_counter()
    st.load_model("small")
    qtbot.waitUntil(lambda: deep.ended_at is not None, timeout=5000)
    assert deep.ended_at - asked < 1.0, f"the forward ran on for {deep.ended_at - asked:.2f} s"
    assert deep.layers_run < LAYERS
    qtbot.waitUntil(lambda: st.result is not None and st.result.model == "small", timeout=10000)


def test_stop_and_a_new_edit_end_the_forward_and_keep_the_last_good_view(qtbot, world):
    st, models = world
    _start_long_run(qtbot, st, models)
    deep = models["deep"]
    asked = time.perf_counter()
    st.stop_run()
    qtbot.waitUntil(lambda: deep.ended_at is not None, timeout=5000)
    assert deep.ended_at - asked < 1.0
    qtbot.waitUntil(lambda: not st.busy, timeout=5000)
    assert st.result is None  # nothing half-done was shown
    deep.ended_at = None
    st.set_text("another text")
    qtbot.waitUntil(lambda: deep.layers_run > 0 and st.run_status() is not None, timeout=5000)
    asked = time.perf_counter()
    st.set_text("another text, edited")  # a new edit: the run in flight is dropped for the newest input
    qtbot.waitUntil(lambda: deep.ended_at is not None, timeout=5000)
    assert deep.ended_at - asked < 1.0


def test_a_model_switch_ends_the_old_models_side_jobs(qtbot, world):
    st, models = world
    _start_long_run(qtbot, st, models)
    ended = {}

    def old_model_job(model, name):  # an analysis forward on the old model: layers, as BlockStack reports them
        try:
            for i in range(LAYERS):
                time.sleep(LAYER_S)
                core_progress.layer_done(i + 1, LAYERS, 1)
        finally:
            ended[name] = time.perf_counter()

    def grid_fill(name):  # the long grid's fill: tiles of the old run's q and k, no model argument
        try:
            for _ in range(LAYERS):
                time.sleep(LAYER_S)
                core_progress.check()  # between tiles (core.lazy.head_pooled)
            yield 1
        finally:
            ended[name] = time.perf_counter()

    assert st.submit(old_model_job, "analysis", key="analysis")
    assert st.submit(grid_fill, "grid", key="long-grid", uses_model=False)
    time.sleep(0.2)
    asked = time.perf_counter()
    st.load_model("small")
    # a job the pool had not started yet never starts (its generator never runs); one that ran ends within 1 s
    qtbot.waitUntil(lambda: not st.job_busy("analysis") and not st.job_busy("long-grid"), timeout=5000)
    assert "analysis" in ended  # it was running: the pool had a thread for it
    assert max(ended.values()) - asked < 1.0, {k: v - asked for k, v in ended.items()}


def test_a_load_drops_the_old_models_kept_prefix(tmp_path):
    """The kept KV cache of the old model (api.prefix) goes when a load begins, before the new weights are read."""
    pytest.importorskip("transformers")
    import attn_explorer as ax
    from attn_explorer.api import prefix
    from attn_explorer.session.jobs import load_job
    from tests.tiny_llama import make_llama_folder

    folder = str(make_llama_folder(tmp_path / "m"))
    m = ax.load_model(folder, device="cpu")
    m.run("The capital of France is Paris.", reuse_prefix=True)
    assert prefix.kept_tokens() > 0
    seen = []

    def loader(src, device="cpu", progress=None, want_image=False):
        seen.append(prefix.kept_tokens())
        return Loaded(model=m, info=m.info)

    load_job(loader, folder, "cpu", False)
    assert seen == [0]
