"""SessionState without a window: loads, runs and the grid's mosaic, with a small fake model whose timing
the test controls (qtbot only runs the event loop)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from attn_explorer.api import display
from attn_explorer.api.result import ModelInfo, RunResult
from attn_explorer.session.jobs import Loaded
from attn_explorer.session.state import SessionState
from attn_explorer.session.workers import live_workers

# A load begins by freeing the old model: a full garbage collection, which took 0.7-1.4 s a load halfway through the
# whole suite's process here (drop_kept_prefix); a bad load is three loads (the good one, the bad one, the good one
# read again), and CI's run of the suite timed out at 10 s there (test_a_bad_load_keeps_the_model_and_its_view)
WAIT_MS = 60_000


class Words:
    """A 'model' that attends uniformly over the words it is given; `gate` holds its runs back."""

    def __init__(self, name: str, gate: threading.Event):
        self.info = ModelInfo(name=name, family="textbook", modality="text", num_layers=2, num_heads=3,
                              hidden_size=8, max_positions=512, device="cpu", dtype="float32", trained=False)
        self.gate = gate
        self.runs: list[str] = []

    def run(self, text, dk_scale=1.0, dk_layers=None, max_tokens=None):
        self.runs.append(text)
        assert self.gate.wait(10)
        words = text.split()[:max_tokens]
        n = len(words)
        att = np.tril(np.ones((2, 3, n, n), np.float32))
        att /= att.sum(-1, keepdims=True)
        return RunResult(attentions=att, tokens=words, special=np.zeros(n, bool), model=self.info.name,
                         dk_scale=dk_scale, forward_ms=1.0, total_tokens=len(text.split()))


@pytest.fixture
def world(qtbot):
    gate = threading.Event()
    gate.set()
    models = {name: Words(name, gate) for name in ("alpha", "beta")}

    def loader(src, device="cpu", progress=None, want_image=False):
        return Loaded(model=models[src or "alpha"], info=models[src or "alpha"].info)

    st = SessionState(loader=loader, device="cpu")
    shown = []
    st.attention_ready.connect(lambda r: shown.append((r.model, " ".join(r.tokens))))
    yield st, models, gate, shown
    gate.set()
    st.shutdown()
    qtbot.waitUntil(lambda: live_workers() == 0, timeout=WAIT_MS)


def test_a_load_runs_the_current_input_and_brings_its_mosaic(qtbot, world):
    st, models, gate, shown = world
    st.text = "one two three"
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    assert shown == [("alpha", "one two three")]
    g = st.grid_image
    assert g is not None and (g.layers, g.heads, g.cell) == (2, 3, 3)
    np.testing.assert_array_equal(g.weights[3:6, 6:9], st.result.attentions[1, 2])  # layer 1, head 2
    assert set(st.run_timing) == {"waited", "to_worker", "forward", "run_other", "pool", "hand_back"}


def test_the_mosaic_is_pooled_outside_the_gui_thread(qtbot, world, monkeypatch):
    st, models, gate, shown = world
    threads = []
    real = display.grid_image
    monkeypatch.setattr(display, "grid_image", lambda a: threads.append(threading.get_ident()) or real(a))
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    assert threads and threading.get_ident() not in threads


def test_the_mosaic_belongs_to_the_result_it_came_with(qtbot, world):
    st, models, gate, shown = world
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    st.result = models["alpha"].run("set by hand")  # no mosaic came with this one
    assert st.grid_image is None


def test_typing_during_a_load_is_run_on_the_new_model(qtbot, world):
    st, models, gate, shown = world
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    gate.clear()
    st.set_text("first words")
    qtbot.waitUntil(lambda: len(models["alpha"].runs) == 2, timeout=WAIT_MS)  # in flight, held at the gate
    st.load_model("beta")
    st.set_text("typed while loading")
    gate.set()
    qtbot.waitUntil(lambda: st.info.name == "beta" and not st.busy, timeout=WAIT_MS)
    assert ("alpha", "first words") not in shown  # the old model's run finished after the load request
    assert shown[-1] == ("beta", "typed while loading") and st.result.model == "beta"
    assert all(r != "typed while loading" for r in models["alpha"].runs)


def test_a_bad_load_keeps_the_model_and_its_view(qtbot, world):
    st, models, gate, shown = world
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    good = st.result
    errors = []
    st.error_raised.connect(errors.append)
    st.load_model("gamma")  # the loader has no such model: KeyError
    qtbot.waitUntil(lambda: bool(errors) and not st.busy, timeout=WAIT_MS)
    assert errors == ["KeyError: 'gamma'"] and st.info.name == "alpha" and st.result is good


def test_the_grid_colour_bar_and_the_mosaic_share_the_log_floor():
    from attn_explorer.maths import LOG_FLOOR, display_values

    assert display.LOG_FLOOR == LOG_FLOOR
    a = np.array([[[[0.5, 1e-6], [0.0, 1.0]]]], np.float32)
    values, levels = display.grid_image(a).values(log=True)
    expect, expect_levels = display_values(a[0, 0], True)
    np.testing.assert_allclose(values, expect, rtol=1e-6)
    assert levels == expect_levels


def _specials(model: Words) -> None:
    """Make the first and last word special, as [CLS] and [SEP] are."""
    plain = model.run

    def run(text, **kw):
        r = plain(text, **kw)
        r.special[[0, -1]] = True
        return r

    model.run = run


def test_hiding_specials_repools_the_shown_result_without_running_the_model(qtbot, world):
    st, models, gate, shown = world
    _specials(models["alpha"])
    st.text = "cls one two three sep"
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    result, runs = st.result, len(models["alpha"].runs)
    st.set_options(hide_special=True)
    qtbot.waitUntil(lambda: st.grid_image is not None and st.grid_image.hidden_specials, timeout=WAIT_MS)
    assert len(models["alpha"].runs) == runs and st.result.attentions is result.attentions  # no forward pass: the same run
    assert st.grid_image.cell == 3 and len(st.timings) == 1  # 3 plain tokens left; no second timing
    assert shown[-1] == ("alpha", "cls one two three sep")  # the views were told to redraw
    st.set_options(hide_special=False)
    qtbot.waitUntil(lambda: st.grid_image is not None and not st.grid_image.hidden_specials, timeout=WAIT_MS)
    assert st.grid_image.cell == 5 and len(models["alpha"].runs) == runs


def test_typing_then_hiding_specials_still_runs_the_typed_text(qtbot, world):
    st, models, gate, shown = world
    _specials(models["alpha"])
    st.text = "cls one sep"
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    gate.clear()
    st.set_text("cls first edit sep")
    qtbot.waitUntil(lambda: models["alpha"].runs[-1] == "cls first edit sep", timeout=WAIT_MS)  # held at the gate
    st.set_text("cls second edit here sep")  # waits
    st.set_options(hide_special=True)  # asked for after the edit: must not replace it
    gate.set()
    qtbot.waitUntil(lambda: not st.busy and " ".join(st.result.tokens) == "cls second edit here sep", timeout=WAIT_MS)
    assert st.grid_image.hidden_specials and st.grid_image.cell == 3


def test_set_text_tells_the_views_once_per_change(qtbot, world):
    """The text lives in the session: whoever sets it (a lesson's button, a file), `text_changed` says so."""
    st, models, gate, shown = world
    said = []
    st.text_changed.connect(said.append)
    st.set_text("from a lesson")
    st.set_text("from a lesson")  # the same text again: nothing to follow
    assert said == ["from a lesson"] and st.text == "from a lesson"


def test_clearing_the_text_drops_the_maps_and_the_run_in_flight(qtbot, world):
    st, models, gate, shown = world
    st.text = "one two three"
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    gate.clear()
    st.set_text("four five")
    qtbot.waitUntil(lambda: models["alpha"].runs[-1] == "four five", timeout=WAIT_MS)  # in flight
    with qtbot.waitSignal(st.input_cleared, timeout=5000):
        st.set_text("  ")
    assert st.result is None and st.grid_image is None and not st.has_input
    gate.set()
    qtbot.waitUntil(lambda: not st.busy and live_workers() == 0, timeout=WAIT_MS)
    assert st.result is None and shown[-1] == ("alpha", "one two three")  # "four five" never arrived
    st.set_text("back again")
    qtbot.waitUntil(lambda: st.result is not None and st.result.tokens == ["back", "again"], timeout=WAIT_MS)


class Sized(Words):
    """A Words model that reads at most `max_positions` words and, like Model.run, refuses an input whose
    maps would not fit in `jobs.memory_budget`."""

    def __init__(self, name, gate, layers, heads, positions):
        super().__init__(name, gate)
        self.info = ModelInfo(name=name, family="textbook", modality="text", num_layers=layers, num_heads=heads,
                              hidden_size=8, max_positions=positions, device="cpu", dtype="float32", trained=True)

    def run(self, text, dk_scale=1.0, dk_layers=None, max_tokens=None):
        from attn_explorer import budget
        from attn_explorer.errors import UserError
        from attn_explorer.session import jobs

        words = text.split()
        k = min(self.info.max_positions, max_tokens or self.info.max_positions)
        n = min(len(words), k)
        need = budget.attention_maps_bytes(n, self.info.num_layers, self.info.num_heads)
        if need > jobs.memory_budget("cpu"):
            raise UserError(f"{n:,} tokens would need {budget.human_bytes(need)}: use fewer tokens")
        self.runs.append(text)
        att = np.full((self.info.num_layers, self.info.num_heads, n, n), 1.0 / n, np.float32)
        return RunResult(attentions=att, tokens=words[:n], special=np.zeros(n, bool), model=self.info.name,
                         dk_scale=dk_scale, forward_ms=1.0, total_tokens=len(words))


def test_a_model_switch_carries_a_long_text_over_cut_to_what_fits(qtbot, monkeypatch):
    """MiniLM cut a 5,821-token text to its 512 positions; SmolLM2 reads 8,192, but the maps of 5,541 tokens
    did not fit in memory: the run was refused ("use fewer tokens") and the old maps stayed. Now the new
    model gets as much of the text as fits, with a note saying why it was cut."""
    from attn_explorer.budget import attention_maps_bytes
    from attn_explorer.session import jobs

    gate = threading.Event()
    gate.set()
    models = {"short": Sized("short", gate, 2, 2, 512), "wide": Sized("wide", gate, 3, 3, 8192)}
    budget = attention_maps_bytes(700, 3, 3) + 1  # 700 tokens of "wide" fit, 701 do not
    monkeypatch.setattr(jobs, "memory_budget", lambda device: budget)
    st = SessionState(loader=lambda src, **kw: Loaded(model=models[src], info=models[src].info), device="cpu")
    errors = []
    st.error_raised.connect(errors.append)
    try:
        st.text = " ".join(f"w{i}" for i in range(5821))
        st.load_model("short")
        qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
        assert st.result.num_tokens == 512 and "512" in st.cut_reason
        st.load_model("wide")
        qtbot.waitUntil(lambda: st.result.model == "wide" and not st.busy, timeout=WAIT_MS)
        r = st.result
        assert errors == []
        assert (r.num_tokens, r.total_tokens) == (700, 5821) and st.fit_tokens == 700
        assert "memory" in st.cut_reason and any("700 of 5,821" in n for n in r.notes)
        st.set_text(" ".join(f"w{i}" for i in range(300)))  # short enough: nothing cut, no note
        qtbot.waitUntil(lambda: st.result.num_tokens == 300, timeout=WAIT_MS)
        assert st.cut_reason == "" and st.result.notes == []
    finally:
        st.shutdown()


def test_side_jobs_always_run_in_a_lane(qtbot, world):
    """The keyless path (a bare worker, no newest-wins) is gone: every side job names its lane."""
    st, models, gate, shown = world
    with pytest.raises(TypeError):
        st.submit(lambda model: 1)
    assert st.submit(lambda model: 1, key="test") is False  # no model yet: nothing starts
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.has_model and not st.busy, timeout=WAIT_MS)
    got = []
    assert st.submit(lambda model: model.info.name, key="test", on_result=got.append) is True
    qtbot.waitUntil(lambda: got == ["alpha"] and not st.job_busy("test"), timeout=WAIT_MS)


def test_hiding_specials_brings_a_new_record_with_its_own_mosaic(qtbot, world):
    """The grid's mosaic travels with its result: re-pooling makes a new record, never rewrites the one shown."""
    st, models, gate, shown = world
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    before, its_grid = st.result, st.grid_image
    with qtbot.waitSignal(st.attention_ready, timeout=WAIT_MS) as sig:
        st.set_options(hide_special=True)
    after = sig.args[0]
    assert after is st.result and after is not before
    assert st.grid_image is after.display and after.display is not its_grid
    assert before.display is its_grid  # the old record still holds the mosaic it came with
    assert after.attentions is before.attentions  # the same run: nothing was run again


def test_a_side_job_of_the_old_model_is_dropped_when_a_saved_run_opens(qtbot, world):
    """File → Open saved run lets the model go: an answer of a side job started on it before must not arrive
    over the saved run's maps (it describes another model and another input)."""
    from attn_explorer.session.reopen import saved_run_of

    st, models, gate, shown = world
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    saved = saved_run_of(st.result)
    hold = threading.Event()
    got, errors = [], []

    def slow(model):
        assert hold.wait(10)
        return model.info.name

    assert st.submit(slow, key="analysis", on_result=got.append, on_error=errors.append)
    st.open_result(saved)
    hold.set()  # the old model's answer comes after the saved run opened
    qtbot.waitUntil(lambda: st.result is not None and bool(st.result_only), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not st.job_busy("analysis"), timeout=WAIT_MS)
    qtbot.wait(50)  # a queued answer would be delivered by now
    assert got == [] and errors == []


def test_rechoosing_the_loaded_model_keeps_its_state(qtbot, world):
    """Choosing under Model the model already loaded does not load it again: the sweep's points and the
    timings stay, and no run starts."""
    st, models, gate, shown = world
    st.load_model("alpha")
    qtbot.waitUntil(lambda: st.result is not None and not st.busy, timeout=WAIT_MS)
    st.sweep_points = [(8, 1.0), (16, 2.0)]
    timings, result = list(st.timings), st.result
    assert st.choose_model("alpha") is False
    qtbot.wait(100)
    assert not st.busy and st.sweep_points == [(8, 1.0), (16, 2.0)]
    assert st.timings == timings and st.result is result and len(shown) == 1
    assert st.choose_model("beta") is True  # another model loads
    qtbot.waitUntil(lambda: st.info.name == "beta" and not st.busy, timeout=WAIT_MS)
    assert st.sweep_points == []
