"""Issue 24 D, memory: a model switch lets the old model go before the new one is read (no reference to its Model
stays: its weights, its kept prefix and the q and k its long run kept are freed), unless the user pinned it; a
pinned model stays in memory and a switch back to it reads nothing."""
from __future__ import annotations

import gc
import weakref

import pytest

pytest.importorskip("transformers")

from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = "The capital of France is Paris. Attention lets every token look at the tokens before it."


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("two")
    return str(make_llama_folder(root / "a", seed=0)), str(make_llama_folder(root / "b", seed=1))


@pytest.fixture
def session(qtbot, folders, monkeypatch):
    import attn_explorer as ax
    from attn_explorer.api import model as api_model
    from attn_explorer.session.jobs import Loaded
    from attn_explorer.session.state import SessionState

    monkeypatch.setattr(api_model, "DENSE_MAX_BYTES", 0)  # long-run style: q and k kept, a prefix cache kept
    reads = []

    def loader(src, device="cpu", progress=None, want_image=False):
        reads.append(src)
        m = ax.load_model(src, device="cpu")
        return Loaded(model=m, info=m.info)

    st = SessionState(loader=loader, device="cpu")
    st.inputs.text = ""
    yield st, reads
    st.shutdown()


def _load(qtbot, st, src):
    st.load_model(src)
    qtbot.waitUntil(lambda: not st.runner.loading and st.host.source == src, timeout=30000)
    qtbot.waitUntil(lambda: not st.busy and (not st.has_input or (st.result is not None
                                                                  and st.result.model == st.info.name)), timeout=30000)


def _gone(ref, qtbot) -> bool:
    for _ in range(20):  # the old jobs' workers end within a moment of the switch
        gc.collect()
        if ref() is None:
            return True
        qtbot.wait(100)
    return False


def test_a_switch_lets_the_old_model_go(qtbot, session, folders):
    st, _ = session
    a, b = folders
    _load(qtbot, st, a)
    st.set_text(TEXT)
    qtbot.waitUntil(lambda: not st.busy and st.result is not None and st.result.is_lazy, timeout=30000)
    old, store = weakref.ref(st.host.model), st.result.lazy
    layer = weakref.ref(store.layers[0].q)  # what the long run kept
    del store
    _load(qtbot, st, b)
    assert _gone(old, qtbot), "a reference to the old Model is still held"
    assert layer() is None, "the old run's q and k are still held"


def test_a_pinned_model_stays_and_comes_back_without_a_read(qtbot, session, folders):
    st, reads = session
    a, b = folders
    _load(qtbot, st, a)
    st.set_text(TEXT)
    qtbot.waitUntil(lambda: not st.busy and st.result is not None, timeout=30000)
    st.set_pinned(True)
    assert st.pinned
    old = weakref.ref(st.host.model)
    _load(qtbot, st, b)
    assert not st.pinned  # the pin is the model's, not the session's
    gc.collect()
    assert old() is not None
    before = list(reads)
    _load(qtbot, st, a)
    assert reads == before and st.host.model is old() and st.pinned  # nothing read again: the pinned one came back
    st.set_pinned(False)
    _load(qtbot, st, b)
    assert _gone(old, qtbot)


def test_a_failed_load_reads_the_let_go_model_again_and_keeps_the_view(qtbot, session, folders, tmp_path):
    st, reads = session
    a, _ = folders
    _load(qtbot, st, a)
    st.set_text(TEXT)
    qtbot.waitUntil(lambda: not st.busy and st.result is not None, timeout=30000)
    shown, errors = st.result, []
    st.error_raised.connect(errors.append)
    st.load_model(str(tmp_path / "no-such-model"))
    qtbot.waitUntil(lambda: bool(errors) and not st.busy and st.host.model is not None, timeout=30000)
    assert reads.count(a) == 2 and st.host.source == a and st.info.name == shown.model
    # the long run's q and k went with the model: the input ran again, on the model read back
    assert st.result is not shown and st.result.model == shown.model and st.result.lazy.layers
