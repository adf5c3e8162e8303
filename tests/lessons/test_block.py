"""Lesson "The Transformer block": the points of one pre-LN block and the residual stream's norms."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_explorer.core.positional import sinusoidal_positions
from attn_explorer.core.textbook import word_vector
from attn_explorer.lessons import block

TEXT = "The animal didn't cross the street because it was too tired."


def test_points_equal_a_direct_computation():
    t = block.trace_block(TEXT)
    blk = block.lesson_block()
    assert blk.norm_first
    words, x = block.embed_words(TEXT, 64)
    assert t.words == words and len(words) == 12
    animal = word_vector("animal", 64) + sinusoidal_positions(12, 64)[1]
    np.testing.assert_array_equal(x[0, 1].numpy(), animal.numpy())
    with torch.inference_mode():
        ln1 = blk.norm1(x)
        mha, _ = blk.attn(ln1)
        res1 = x + mha
        ln2 = blk.norm2(res1)
        hidden = blk.mlp.act(blk.mlp.fc1(ln2))
        mlp = blk.mlp(ln2)
        res2 = res1 + mlp
        out, _ = blk(x)
    direct = {"x": x, "ln1": ln1, "mha": mha, "res1": res1, "ln2": ln2, "hidden": hidden, "mlp": mlp, "res2": res2}
    torch.testing.assert_close(res2, out)
    assert [p.key for p in t.points] == list(block.POINTS)
    for p in t.points:
        want = direct[p.key][0].numpy()
        assert p.shape == want.shape
        np.testing.assert_allclose(t.tensors[p.key], want, atol=1e-5)
        assert p.norm == pytest.approx(float(np.linalg.norm(want, axis=-1).mean()), rel=1e-5)
    assert t.points[5].shape == (12, 256)
    assert t.points[1].norm == pytest.approx(8.0, rel=1e-3)  # LayerNorm: length √D (unit gain at init)


def test_block_is_seeded_and_hooks_are_removed():
    a = block.trace_block("one two three", dim=32, num_heads=2, mlp_hidden=64)
    blk = block.lesson_block(32, 2, 64)
    assert not blk._forward_hooks and not blk.norm1._forward_pre_hooks
    block.lesson_block.cache_clear()
    b = block.trace_block("one two three", dim=32, num_heads=2, mlp_hidden=64)
    np.testing.assert_array_equal(a.tensors["res2"], b.tensors["res2"])


def test_stream_norms_of_minilm():
    import attn_explorer as ax

    m = ax.load_model("minilm", device="cpu")
    s = block.stream_norms(m, TEXT)
    assert len(s.norms) == m.info.num_layers + 1 and s.norms[0] > 0
    assert s.norm_first is False and s.trained
    assert not any(layer._forward_hooks for layer in m.module.blocks.layers)
    # the last entry is the model's own last hidden state
    r = m.run(TEXT, hidden=True)
    assert s.num_tokens == r.num_tokens
    assert s.norms[-1] == pytest.approx(float(np.linalg.norm(r.hidden, axis=-1).mean()), rel=1e-5)


def test_stream_norms_of_a_pre_ln_model_grow():
    import attn_explorer as ax
    from attn_explorer.resources import resource_path

    cat = str(resource_path("samples", "chelsea-cat.jpg"))
    s = block.stream_norms(ax.load_model("textbook-vit", device="cpu"), cat)
    assert s.norm_first and not s.trained
    assert len(s.norms) == 7 and s.num_tokens == 197
    assert s.norms[-1] > s.norms[0]
