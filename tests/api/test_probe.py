"""layer_qkv: one layer's own q, k, v, per head, from one forward pass of the real model."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

import attn_explorer as ax
from attn_explorer.api.probe import layer_qkv
from attn_explorer.errors import UserError

transformers = pytest.importorskip("transformers")
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "animal", "street", "it", "was", "tired", "cross", "."]


def _attention_from(q, k, dk_scale=1.0):
    return torch.softmax(q @ k.transpose(-1, -2) * dk_scale / math.sqrt(q.shape[-1]), dim=-1)


def test_bert_qkv_match_transformers_projections(tmp_path):
    """Against HF's own query/key/value layers applied to HF's hidden state entering that layer."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(WORDS), hidden_size=24, num_hidden_layers=3, num_attention_heads=3,
                                  intermediate_size=30, max_position_embeddings=16, attn_implementation="eager")
    hf = transformers.BertModel(cfg).eval()
    hf.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    m = ax.load_model(str(tmp_path), device="cpu")
    text = "the animal was tired . it was the street"
    ids = torch.tensor([m.tokenizer.encode(text, 16).ids])
    with torch.no_grad():
        ref = hf(input_ids=ids, output_hidden_states=True)
    for layer in range(3):
        q, k, v = layer_qkv(m, text, layer)
        att = hf.encoder.layer[layer].attention.self
        h = ref.hidden_states[layer][0]  # (N, D): what enters this layer
        for ours, proj in ((q, att.query), (k, att.key), (v, att.value)):
            with torch.no_grad():
                want = proj(h).view(h.shape[0], 3, 8).transpose(0, 1)  # (H, N, d_k)
            assert ours.shape == (3, ids.shape[1], 8) and ours.is_contiguous()
            torch.testing.assert_close(ours, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dk_scale", [1.0, 2.5])
def test_qk_give_the_layers_attention_text(dk_scale):
    m = ax.load_model("minilm", device="cpu")
    text = "The animal didn't cross the street because it was too tired"
    r = m.run(text, dk_scale=dk_scale, max_tokens=9)
    for layer in (0, 5):
        q, k, v = layer_qkv(m, text, layer, dk_scale=dk_scale, max_tokens=9)
        assert q.shape == k.shape == v.shape == (12, 9, 32)
        np.testing.assert_allclose(_attention_from(q, k, dk_scale).numpy(), r.attentions[layer], atol=1e-5)


def test_qk_give_the_layers_attention_image():
    m = ax.load_model("textbook-vit", device="cpu")
    img = Image.fromarray((np.random.default_rng(0).random((60, 80, 3)) * 255).astype(np.uint8))
    r = m.run(img, image_size=64)
    q, k, v = layer_qkv(m, img, 3, image_size=64)
    assert q.shape == (3, 1 + 16, 64)  # [CLS] + a 4×4 grid, d_k = 192 / 3
    np.testing.assert_allclose(_attention_from(q, k).numpy(), r.attentions[3], atol=1e-5)


def test_bad_layer_and_options_refused():
    m = ax.load_model("textbook", device="cpu")
    for bad in (-1, 2, "x"):
        with pytest.raises(UserError, match="layer") as e:
            layer_qkv(m, "one two three", bad)
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="hidden"):
        layer_qkv(m, "one two three", 0, hidden=True)
    with pytest.raises(UserError, match="empty"):
        layer_qkv(m, "   ", 0)
