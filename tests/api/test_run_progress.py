"""A forward the caller can follow and stop (core.progress.watching): each finished layer is reported from
the forward's own layer loop (no second forward, no hook, so prefix reuse stays on), and stop() ends the
forward between layers, or between a lazy layer's query chunks, with the dedicated Stopped exception."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.api.progress import Stopped, watching  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = "The capital of France is Paris. Attention lets every token look at the tokens before it."


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = make_llama_folder(tmp_path_factory.mktemp("deep") / "m", num_hidden_layers=6)
    return ax.load_model(str(folder), device="cpu")


@pytest.mark.parametrize("lazy", [False, True])
def test_each_layer_is_reported_once_in_order(model, lazy):
    seen = []
    with watching(lambda done, total, n: seen.append((done, total, n))):
        r = model.run(TEXT, lazy=lazy)
    assert [s[0] for s in seen] == list(range(1, 7))
    assert {s[1] for s in seen} == {6} and {s[2] for s in seen} == {r.num_tokens}


@pytest.mark.parametrize("lazy", [False, True])
def test_stop_ends_the_forward_between_layers(model, lazy):
    seen = []
    with pytest.raises(Stopped), watching(lambda done, total, n: seen.append(done), stop=lambda: len(seen) >= 2):
        model.run(TEXT, lazy=lazy)
    assert seen == [1, 2]  # layer 3 never ran


def test_prefix_reuse_still_reports_the_layers_it_runs(model):
    model.run(TEXT, reuse_prefix=True)
    seen = []
    with watching(lambda done, total, n: seen.append((done, n))):
        r = model.run(TEXT + " Paris", reuse_prefix=True)
    assert r.reuse.startswith("reused")  # the watcher is no hook: the prefix was still reused
    assert [d for d, _ in seen] == list(range(1, 7)) and seen[0][1] < r.num_tokens  # only the new tokens ran


def test_stop_is_checked_between_lazy_chunks():
    from attn_explorer.core import lazy as core_lazy
    import torch

    q = torch.randn(1, 2, 300, 8)
    k, v = torch.randn(1, 2, 300, 8), torch.randn(1, 2, 300, 8)
    o = core_lazy.LayerOptions(causal=True, window=64, softcap=None, mask=None, scale=0.35, sinks=None, chunk=None)
    calls = []
    with pytest.raises(Stopped), watching(stop=lambda: calls.append(1) or len(calls) > 2):
        core_lazy._keep_flash_cpu(q, k, v, o, chunk=64)
    assert len(calls) == 3
