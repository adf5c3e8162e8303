"""Issue 23 part C on Qwen3-MoE (a tiny random folder with a dense layer between MoE ones): the hook points with
the routing ones, lazy attention, prefix reuse, the interventions, relevance and the lens work on it; and
RunResult.routing travels to `export` (.npz, .json, and chosen layers of a lazy run)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity_moe import make_folder  # noqa: E402

TEXT = "The capital of France is Paris. The capital of Italy is Rome and the capital of Spain"


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_moe-dense")
    make_folder(folder, "qwen3_moe-dense")  # MoE, dense, MoE
    return ax.load_model(str(folder), device="cpu")


def _same_routing(a, b, atol=1e-6):
    assert a.num_experts == b.num_experts and a.moe_layers == b.moe_layers
    for i in a.moe_layers:
        assert np.array_equal(a.experts[i], b.experts[i]), i
        np.testing.assert_allclose(a.weights[i], b.weights[i], atol=atol)


def test_hook_names_have_the_routing_points_on_moe_layers_only(m):
    names = m.hook_names()
    assert "blocks.0.mlp.hook_expert_indices" in names and "blocks.2.mlp.hook_expert_weights" in names
    assert not any(n.startswith("blocks.1.mlp.hook_expert") for n in names)
    at = names.index("blocks.0.mlp.hook_expert_indices")
    assert names[at:at + 3] == ["blocks.0.mlp.hook_expert_indices", "blocks.0.mlp.hook_expert_weights",
                                "blocks.0.hook_mlp_out"]  # reached inside the MLP, before its output
    r, cache = m.run_with_cache(TEXT)
    assert set(names) - set(cache) == set()  # every point, the routing ones too
    assert torch.equal(cache["blocks.2.mlp.hook_expert_indices"][0], torch.from_numpy(r.routing.experts[2]))
    with pytest.raises(UserError, match="not a hook point"):
        m.run_with_hooks(TEXT, hooks={"blocks.1.mlp.hook_expert_indices": lambda x, n: None})


def test_a_hook_can_reroute_and_a_bad_expert_is_one_line(m):
    base = m.run(TEXT, hidden=True)
    forced = m.run_with_hooks(TEXT, hidden=True,
                              hooks={"blocks.2.mlp.hook_expert_indices": lambda x, n: torch.full_like(x, 0)})
    assert (forced.routing.experts[2] == 0).all()
    assert np.abs(forced.hidden - base.hidden).max() > 1e-3  # the experts ran on the new choice
    np.testing.assert_array_equal(forced.attentions, base.attentions)  # layer 2's MLP comes after every map
    with pytest.raises(UserError, match="expert 6") as e:
        m.run_with_hooks(TEXT, hooks={"blocks.0.mlp.hook_expert_indices": lambda x, n: torch.full_like(x, 6)})
    assert "\n" not in str(e.value)


def test_lazy_run_fills_routing_and_its_maps_equal_the_dense_ones(m):
    dense, lazy = m.run(TEXT), m.run(TEXT, lazy=True)
    assert lazy.is_lazy
    _same_routing(dense.routing, lazy.routing)
    for layer in range(3):
        for head in (0, 5):
            np.testing.assert_allclose(lazy.attention(layer, head), dense.attentions[layer, head], atol=1e-6,
                                       rtol=1e-5)


@pytest.mark.parametrize("lazy", [False, True])
def test_prefix_reuse_splices_the_routing(m, lazy):
    from attn_explorer.api import prefix
    prefix.forget()
    m.run(TEXT, reuse_prefix=True, lazy=lazy)
    edited = TEXT + " is Madrid"
    r = m.run(edited, reuse_prefix=True, lazy=lazy)
    assert r.reuse.startswith("reused ") and not r.reuse.startswith("reused 0")
    _same_routing(r.routing, m.run(edited).routing)
    prefix.forget()


def test_ablation_and_patching(m):
    from attn_explorer.analysis import interventions
    base, off = m.run(TEXT, hidden=True), m.run(TEXT, hidden=True, ablate={(0, 1): "zero", (0, 3): "mean"})
    assert np.abs(off.hidden - base.hidden).max() > 1e-4 and off.routing is not None
    c = interventions.compare(m, TEXT, {(0, 1): "zero"})
    assert c is not None
    corrupt = TEXT.replace("France", "Japan")  # the same token count
    assert len(m.prepare(corrupt).tokens) == len(m.prepare(TEXT).tokens)
    p = interventions.patch(m, TEXT, corrupt, heads=[(0, h) for h in range(6)] + [(1, h) for h in range(6)])
    assert np.isfinite(p.patched) and p.patched != p.corrupt


@pytest.mark.parametrize("method", ["gradient_rollout", "attnlrp", "rollout", "attention"])
def test_relevance_runs(m, method):
    from attn_explorer.analysis.relevance import explain
    r = explain(m, TEXT, method=method)
    assert r.scores.shape == (len(m.prepare(TEXT).tokens),) and np.isfinite(r.scores).all()


def test_the_lens_pieces_add_up_to_the_logit(m):
    from attn_explorer.analysis import lens
    a = lens.logit_attribution(m, TEXT)
    assert a.total == pytest.approx(a.logit, abs=1e-3 * max(1.0, abs(a.logit)))
    assert len(lens.logit_lens(m, TEXT).tokens) == len(m.prepare(TEXT).tokens)


def test_export_writes_routing(m, tmp_path):
    from attn_explorer.cli.export import chosen_arrays, save_result
    r = m.run(TEXT)
    save_result(r, tmp_path / "r.npz")
    d = np.load(tmp_path / "r.npz")
    n = len(r.tokens)
    assert d["routing_experts"].shape == (3, n, 3) and d["routing_weights"].dtype == np.float32
    assert (d["routing_experts"][1] == -1).all() and (d["routing_weights"][1] == 0).all()  # the dense layer
    assert np.array_equal(d["routing_experts"][2], r.routing.experts[2]) and int(d["routing_num_experts"]) == 6
    save_result(r, tmp_path / "r.json")
    j = json.loads((tmp_path / "r.json").read_text())
    assert j["routing_experts"][0] == r.routing.experts[0].tolist()
    lazy = m.run(TEXT, lazy=True)
    part = chosen_arrays(lazy, {"layers": [2], "heads": [0], "pool": None})
    assert part["routing_experts"].shape == (1, n, 3) and np.array_equal(part["routing_experts"][0],
                                                                         r.routing.experts[2])


def test_export_cli(m, tmp_path):
    from attn_explorer.cli.main import main
    folder = m.source["src"]
    assert main(["export", "--model", folder, "--text", TEXT, "--out", str(tmp_path / "c.npz")]) == 0
    assert np.load(tmp_path / "c.npz")["routing_experts"].shape[0] == 3


def test_a_saved_run_reopens_with_its_routing(m, tmp_path):
    from attn_explorer.files import save_npz
    from attn_explorer.session.reopen import read_run
    r = m.run(TEXT)
    path = save_npz(r, tmp_path / "r.npz")
    back = read_run(str(path)).result.routing
    _same_routing(r.routing, back, atol=0)
    assert back.experts[1] is None  # the dense layer stays dense
    arrays = dict(np.load(path))
    arrays["routing_experts"] = arrays["routing_experts"].copy()
    arrays["routing_experts"][0, 0, 0] = 6  # no such expert
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(UserError, match="routing_experts") as e:
        read_run(str(tmp_path / "bad.npz"))
    assert "\n" not in str(e.value)


def test_why_this_head_adds_up_and_the_contribution_graph_runs(m):
    from attn_explorer.analysis import why
    from attn_explorer.analysis.flow import contribution_graph
    for layer in (0, 2):  # MoE layers (the MLPs do not enter one head's logit)
        w = why.why_matrix(m, TEXT, None, layer, 1, 6, 2)
        assert abs(w.total - w.logit) < 1e-4, (layer, w.total, w.logit)
    assert contribution_graph(m, TEXT) is not None
