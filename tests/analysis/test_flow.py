"""The contribution graph: a planted route is found, the shares are proportions, and it runs on real families."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_explorer.analysis import flow
from attn_explorer.api.model import Model
from attn_explorer.api.result import ModelInfo
from attn_explorer.core.gpt2 import GPT2, GPT2Config
from attn_explorer.errors import UserError
from tests.analysis.test_lens import IDS, decoders  # noqa: F401 - the fixture

D, HEADS, SRC_ID = 16, 2, 0
ROUTE_HEAD = 1


def planted(seed: int = 0) -> Model:
    """A two-layer GPT-2 whose only working head is layer 1's head 1: every query attends to the token with id 0
    and copies it, strongly. Layer 0's attention and both MLPs write nothing."""
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=12, dim=D, num_layers=2, num_heads=HEADS, mlp_hidden=16, max_positions=16)
    m = GPT2(cfg).eval()
    d = D // HEADS
    with torch.no_grad():
        m.wpe.weight.zero_()
        m.wte.weight.normal_(std=1.0)
        m.wte.weight[:, 0] = -1.0
        m.wte.weight[SRC_ID] = 0.0
        m.wte.weight[SRC_ID, 0] = 6.0  # token 0 stands out in dimension 0
        for block in m.blocks.layers:
            block.mlp.fc2.weight.zero_()
            block.mlp.fc2.bias.zero_()
            block.attn.out.weight.zero_()
            block.attn.out.bias.zero_()
            block.attn.qkv.weight.normal_(std=0.1)
            block.attn.qkv.bias.zero_()
        attn = m.blocks.layers[1].attn
        q0, k0, v0 = ROUTE_HEAD * d, D + ROUTE_HEAD * d, 2 * D + ROUTE_HEAD * d
        attn.qkv.weight[q0:q0 + d] = 0
        attn.qkv.bias[q0] = 10.0  # every query asks along one direction...
        attn.qkv.weight[k0:k0 + d] = 0
        attn.qkv.weight[k0, 0] = 10.0  # ...that only token 0's key answers
        attn.out.weight[:, ROUTE_HEAD * d:(ROUTE_HEAD + 1) * d] = torch.randn(D, d) * 3.0  # and it writes loudly
    info = ModelInfo(name="planted", family="gpt2", modality="text", num_layers=2, num_heads=HEADS, hidden_size=D,
                     max_positions=16, device="cpu", dtype="float32", trained=False, causal=True, can_generate=True)
    return Model(m, info)


@pytest.mark.parametrize("where", [0, 3])
def test_planted_route_is_found(where):
    m = planted()
    ids = [5, 6, 7, 8, 9, 10, 11]
    ids[where] = SRC_ID
    g = flow.contribution_graph(m, ids)
    edges, nodes = flow.trace(g, -1, threshold=0.2)
    through = [e for e in edges if e.kind == "attn"]
    last = len(ids) - 1
    assert [(e.layer, e.src, e.dst) for e in through] == [(1, where, last)]
    assert through[0].head == ROUTE_HEAD and through[0].weight > 0.3
    assert g.head_shares(1, where, last)[ROUTE_HEAD] > 0.99
    assert (0, where) in nodes and (1, where) in nodes  # the source reaches the embeddings through its own stream
    assert g.resid[1, last] < through[0].weight  # the copied token outweighs the last token's own stream
    assert np.all(g.attn[0] < 1e-6)  # layer 0's heads write nothing: no share


def test_shares_are_proportions(decoders):  # noqa: F811
    for family in ("llama", "gemma3"):
        m = decoders(family)
        g = flow.contribution_graph(m, IDS)
        L, N = m.info.num_layers, len(IDS)
        assert g.attn.shape == (L, N, N) and g.heads.shape == (L, m.info.num_heads, N, N)
        total = g.attn.sum(-1) + g.resid
        assert np.all(total <= 1 + 1e-5) and np.all(total > 0.5)  # the rest is the biases' share
        assert np.all(np.triu(g.attn[0], 1) == 0)  # causal: nothing flows from a later token
        assert np.all((g.mlp >= 0) & (g.mlp <= 1))


def test_trace_threshold_prunes_and_bad_values(decoders):  # noqa: F811
    g = flow.contribution_graph(decoders("gpt2"), IDS)
    lo, _ = flow.trace(g, -1, 0.01)
    hi, _ = flow.trace(g, -1, 0.3)
    assert len(hi) < len(lo) and set(hi) <= set(lo)
    with pytest.raises(UserError, match="threshold"):
        flow.trace(g, -1, 0)
    with pytest.raises(UserError, match="position"):
        flow.trace(g, 40, 0.1)
    js = flow.graph_json(g, -1, 0.3)
    assert len(js["edges"]) == len(hi)


def test_progress_reaches_the_end(decoders):  # noqa: F811
    seen = []
    flow.contribution_graph(decoders("gpt2"), IDS, progress=lambda f, m: seen.append(f))
    assert seen[-1] == 1.0 and len(seen) == 3


def test_too_long_for_memory_is_one_line(decoders, monkeypatch):  # noqa: F811
    """The graph keeps every layer's maps: an input whose maps would not fit is refused before the forward pass."""
    from attn_explorer import budget

    monkeypatch.setattr(budget, "default_budget", lambda device="cpu": 1000)
    with pytest.raises(UserError, match="tokens would need .* for every layer's attention maps"):
        flow.contribution_graph(decoders("gpt2"), IDS)


def _graph(shares, resid):
    """A one-layer graph by hand: token 2's attention shares over tokens 0..2 and its residual share."""
    N = len(shares)
    attn = np.zeros((1, N, N), np.float32)
    attn[0, N - 1] = shares
    res = np.zeros((1, N), np.float32)
    res[0, N - 1] = resid
    heads = np.ones((1, 1, N, N), np.float16)
    return flow.FlowGraph([f"t{i}" for i in range(N)], attn, res, np.zeros((1, N), np.float32), heads)


@pytest.mark.parametrize("tau", [0.25, 0.04, 0.1, 0.3])
def test_an_edge_exactly_at_the_threshold_is_kept(tau):
    """trace keeps "each edge whose share reaches a threshold" (flow's docstring, Ferrando & Voita's
    Algorithm 1): share >= threshold. An edge whose share is the threshold, as the graph stores shares
    (float32), is kept, attention and residual alike; the next float32 below it is not. 0.04 (the default),
    0.1 and 0.3 have no exact binary form: the share stored for them is float32(tau), below the float64 tau
    for 0.04 (0.0399999991) and above it for 0.1 and 0.3; the user set 0.04, the edge reads 0.04, and it must
    stay (a comparison in float64 would drop it)."""
    at = np.float32(tau)
    below = np.nextafter(at, np.float32(0))
    edges, nodes = flow.trace(_graph([at, below, 1 - at - below], at), -1, threshold=tau)
    kept = {(e.kind, e.src) for e in edges}
    assert ("attn", 0) in kept and ("resid", 2) in kept, kept  # exactly at: kept
    assert ("attn", 1) not in kept and (0, 1) not in nodes  # just below: pruned
