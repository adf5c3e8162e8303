"""Lesson inside-a-head: api.probe.head_trace gives the numbers of ONE forward pass, and the lesson's table
arranges them without changing them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attn_explorer as ax
from attn_explorer.api.hooks import heads_first
from attn_explorer.api.probe import head_trace
from attn_explorer.errors import UserError
from attn_explorer.lessons.inside_a_head import trace_table

TEXT = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module")
def minilm():
    return ax.load_model("minilm", device="cpu")


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """A random causal GPT-2 with a byte-level BPE tokenizer trained here."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path_factory.mktemp("gpt2")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([TEXT, "the street was quiet"] * 20, vocab_size=300, min_frequency=1, show_progress=False)
    tok.save_model(str(folder))
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=16, n_layer=2, n_head=2, n_positions=64)
    transformers.GPT2Model(cfg).save_pretrained(folder)
    return ax.load_model(str(folder), device="cpu")


def captured(model, layer, dk_scale=1.0, dk_layers=None):
    """That layer's q, k, v and per-head outputs after W_O (B, H, N, ·), read through its hook points, and
    its attention, from a forward pass of our core, run here on its own."""
    prep = model.prepare(TEXT)
    a = f"blocks.{layer}.attn."
    t = model.trace(prep, names=[a + "hook_q", a + "hook_k", a + "hook_v", a + "hook_z"], dk_scale=dk_scale,
                    dk_layers=dk_layers, attentions=True)
    h = model.info.num_heads
    cap = {key: heads_first(t.cache[a + point], h)
           for key, point in (("q", "hook_q"), ("k", "hook_k"), ("values", "hook_v"))}
    cap["head_outputs"] = torch.einsum("bhnd,hde->bhne", heads_first(t.cache[a + "hook_z"], h),
                                       model.W_O(layer).detach())
    return cap, t.out.attentions[0, layer]


@pytest.mark.parametrize("layer,head,query", [(0, 0, 10), (3, 7, 2), (5, 11, 0)])
def test_weights_and_weighted_sum_are_the_forward_pass_own(minilm, layer, head, query):
    t = head_trace(minilm, TEXT, layer, head, query)
    r = minilm.run(TEXT)
    np.testing.assert_array_equal(t.attention_row, r.attentions[layer, head, query])
    np.testing.assert_allclose(t.probs, r.attentions[layer, head, query], atol=1e-7)
    assert t.probs.sum() == pytest.approx(1.0, abs=1e-5)
    cap, att = captured(minilm, layer)
    np.testing.assert_allclose(t.q, cap["q"][0, head, query].numpy(), rtol=1e-6)
    np.testing.assert_allclose(t.k, cap["k"][0, head].numpy(), rtol=1e-6)
    np.testing.assert_allclose(t.v, cap["values"][0, head].numpy(), rtol=1e-6)
    # the weighted sum of the values is the head's output before W_O: after W_O it is core's head_outputs
    w_o = minilm.module.blocks.layers[layer].attn.out.weight.detach().double()  # (D, H·d_k)
    d_k = t.d_k
    share = w_o[:, head * d_k:(head + 1) * d_k].numpy() @ t.output
    np.testing.assert_allclose(share, cap["head_outputs"][0, head, query].double().numpy(), atol=1e-5)
    np.testing.assert_allclose(t.head_share, cap["head_outputs"][0, head, query].double().numpy(), atol=1e-6)
    np.testing.assert_allclose(t.output, att[head, query].double().numpy() @ t.v, atol=1e-6)
    # the steps a learner follows redo the model's softmax
    e = np.exp(t.logits * t.scale - (t.logits * t.scale).max())
    np.testing.assert_allclose(e / e.sum(), t.probs, atol=1e-6)
    assert t.scale == pytest.approx(1 / np.sqrt(d_k))


def test_dk_scale_changes_the_numbers_only_where_it_applies(minilm):
    base = head_trace(minilm, TEXT, 2, 1, 10)
    sharp = head_trace(minilm, TEXT, 2, 1, 10, dk_scale=3.0)
    assert sharp.scale == pytest.approx(3.0 * base.scale) and sharp.dk_scale == 3.0
    np.testing.assert_allclose(sharp.probs, minilm.run(TEXT, dk_scale=3.0).attentions[2, 1, 10], atol=1e-7)
    assert sharp.probs.max() > base.probs.max()
    elsewhere = head_trace(minilm, TEXT, 2, 1, 10, dk_scale=3.0, dk_layers=[4])
    assert elsewhere.dk_scale == 1.0 and elsewhere.scale == pytest.approx(base.scale)
    np.testing.assert_allclose(elsewhere.probs, base.probs, atol=1e-7)


def test_causal_model_hides_later_keys(tiny_gpt2):
    r = tiny_gpt2.run(TEXT)
    q = 4
    t = head_trace(tiny_gpt2, TEXT, 1, 1, q)
    assert t.allowed.tolist() == [j <= q for j in range(r.num_tokens)]
    np.testing.assert_allclose(t.probs, r.attentions[1, 1, q], atol=1e-7)
    tab = trace_table(t)
    assert tab.hidden_count == r.num_tokens - q - 1
    assert sorted(row.index for row in tab.rows) == list(range(q + 1))
    assert tab.softmax_gap < 1e-5


def test_table_lists_the_top_keys_and_sums_the_rest(minilm):
    t = head_trace(minilm, TEXT, 1, 4, 3)
    n = len(t.tokens)
    tab = trace_table(t, top=5)
    weights = [row.weight for row in tab.rows]
    assert len(tab.rows) == 5 and weights == sorted(weights, reverse=True)
    assert weights[0] == pytest.approx(t.probs.max())
    assert tab.rest_count == n - 5
    assert sum(weights) + tab.rest_weight == pytest.approx(1.0, abs=1e-5)
    assert tab.weight_sum == pytest.approx(1.0, abs=1e-5)
    assert tab.softmax_gap < 1e-5
    assert max(row.exp for row in tab.rows) == pytest.approx(1.0)  # exp(s - max) of the top key


def test_bad_selection_is_one_line(minilm):
    with pytest.raises(UserError, match="head 12 does not exist"):
        head_trace(minilm, TEXT, 0, 12, 0)
    with pytest.raises(UserError, match="token 99 does not exist"):
        head_trace(minilm, TEXT, 0, 0, 99)
    with pytest.raises(UserError, match="layer 6 does not exist"):
        head_trace(minilm, TEXT, 6, 0, 0)
