"""GenerationSession: a stream of steps on the session's model, restart and new-model behaviour."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from attn_explorer.session.generation import GenerationSession  # noqa: E402
from attn_explorer.session.state import SessionState  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("llama")))


def _loaded(qtbot, src):
    state = SessionState(device="cpu")
    state.load_model(src, want_image=False)
    qtbot.waitUntil(lambda: state.info is not None and not state.busy, timeout=60000)
    return state


def test_without_a_decoder_nothing_starts(qtbot):
    state = SessionState(device="cpu")
    gen = GenerationSession(state)
    assert not gen.can_generate and gen.start("hello") is False and not gen.running
    state = _loaded(qtbot, "textbook")
    gen = GenerationSession(state)
    assert not gen.can_generate and gen.start("hello") is False
    state.shutdown()


def test_steps_stream_in_order_and_a_restart_drops_the_old_stream(qtbot, folder):
    state = _loaded(qtbot, folder)
    gen = GenerationSession(state)
    ends, prompts = [], []
    gen.finished.connect(ends.append)
    gen.prompt_ready.connect(prompts.append)
    assert gen.start("The capital of", max_new_tokens=40)
    assert gen.start("Attention lets", max_new_tokens=4)  # replaces the first before it is done
    qtbot.waitUntil(lambda: bool(ends), timeout=30000)
    assert ends == ["done"] and [p.text for p in prompts][-1] == "Attention lets"
    assert [s.index for s in gen.steps] == list(range(len(gen.steps))) and 1 <= len(gen.steps) <= 4
    n0 = len(gen.prompt.ids)
    assert [s.attention.shape[-1] for s in gen.steps] == list(range(n0, n0 + len(gen.steps)))
    assert len(gen.sink) == len(gen.steps) and gen.text
    assert gen.newest_rows().shape == (12, n0 + len(gen.steps) - 1)
    state.shutdown()


def test_a_bad_request_is_one_line_on_the_session(qtbot, folder):
    state = _loaded(qtbot, folder)
    gen = GenerationSession(state)
    errors, ends = [], []
    state.error_raised.connect(errors.append)
    gen.finished.connect(ends.append)
    gen.start("hello", max_new_tokens=1000)  # more than the model's 128 positions
    qtbot.waitUntil(lambda: bool(ends), timeout=30000)
    assert "positions" in errors[0] and ends[0].startswith("failed:") and not gen.running
    state.shutdown()


def test_the_generation_runs_in_the_generate_lane_and_stop_empties_it(qtbot, folder):
    state = _loaded(qtbot, folder)
    gen = GenerationSession(state)
    ends = []
    gen.finished.connect(ends.append)
    assert gen.start("The capital of", max_new_tokens=40)
    assert state.job_busy("generate") and gen.running
    with qtbot.waitSignal(gen.step_arrived, timeout=30000):
        pass
    gen.stop()
    assert ends == ["stopped"] and not gen.running
    qtbot.waitUntil(lambda: not state.job_busy("generate"), timeout=30000)  # the job ended at its next step
    assert ends == ["stopped"] and len(gen.steps) >= 1
    state.shutdown()
