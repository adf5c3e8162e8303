"""Gradient relevance (analysis.relevance): attention differentiable on request for every family, gradients
that agree with central differences, a planted token found first, and batches that change nothing."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_explorer.api.hooks import caching_hook, merge
from attn_explorer.api.model import Model
from attn_explorer.api.result import ModelInfo
from attn_explorer.core.encoder import EncoderConfig, TextEncoder
from attn_explorer.core.gpt2 import GPT2, GPT2Config
from attn_explorer.core.hooks import Hooks
from attn_explorer.core.llama import Llama, LlamaConfig
from attn_explorer.core.vit import ViTConfig, VisionTransformer


def tiny(family: str, seed: int = 0):
    """A tiny random module of `family` and its forward's inputs (seeded)."""
    torch.manual_seed(seed)
    if family == "llama":
        m = Llama(LlamaConfig(vocab_size=40, dim=24, num_layers=2, num_heads=4, num_kv_heads=2, mlp_hidden=32,
                              max_positions=64))
    elif family == "gemma":
        m = Llama(LlamaConfig(vocab_size=40, dim=24, num_layers=2, num_heads=4, num_kv_heads=2, mlp_hidden=32,
                              max_positions=64, norm="rms1p", act="gelu_tanh", qk_norm=True, sandwich_norms=True,
                              scale_embeddings=True, sliding_windows=[4, None], rope_local_theta=10000.0))
    elif family == "gpt2":
        m = GPT2(GPT2Config(vocab_size=40, dim=24, num_layers=2, num_heads=4, mlp_hidden=32, max_positions=64))
    elif family == "bart":
        from attn_explorer.core.encoder_decoder import EncoderDecoder, EncoderDecoderConfig

        m = EncoderDecoder(EncoderDecoderConfig(vocab_size=40, dim=24, num_layers=2, num_heads=4, mlp_hidden=32,
                                                decoder_layers=2, decoder_heads=4, decoder_mlp_hidden=32,
                                                max_positions=64))
    elif family == "clip_text":
        from attn_explorer.core.clip_text import ClipTextConfig, ClipTextTransformer

        m = ClipTextTransformer(ClipTextConfig(vocab_size=40, dim=24, num_layers=2, num_heads=4, mlp_hidden=32,
                                               max_positions=16))
    elif family == "bert":
        m = TextEncoder(EncoderConfig(vocab_size=40, dim=24, num_layers=2, num_heads=4, mlp_hidden=32,
                                      max_positions=64))
    else:
        m = VisionTransformer(ViTConfig(image_size=8, patch_size=2, dim=24, num_layers=2, num_heads=4, mlp_hidden=32,
                                        num_labels=3, distillation_token=family == "deit",
                                        classifier_tokens=2 if family == "deit" else 1))
        return m.eval(), {"pixels": torch.randn(2, 3, 8, 8)}
    return m.eval(), {"input_ids": torch.randint(0, 40, (2, 7))}


def wrap(module, family: str = "vit") -> Model:
    """A bare core module as an api Model (what analysis.relevance.token_relevance takes)."""
    blocks = module.blocks.layers
    info = ModelInfo(name=f"tiny-{family}", family=family,
                     modality="image" if family in ("vit", "deit") else "text", num_layers=len(blocks),
                     num_heads=blocks[0].attn.num_heads, hidden_size=blocks[0].attn.out.out_features,
                     max_positions=64, device="cpu", dtype="float32", trained=False)
    return Model(module, info)


FAMILIES = ["llama", "gemma", "gpt2", "bert", "vit", "deit"]


@pytest.mark.parametrize("family", FAMILIES + ["bart", "clip_text"])
def test_attention_differentiable_after_an_inference_run(family):
    """A run under inference_mode first (as Model.run does) must not poison a later run with autograd: the
    saved probabilities take gradients, and the maps returned are the same as the in-place path's."""
    m, inputs = tiny(family)
    with torch.inference_mode():
        ref = m(output_attentions=True, **inputs).attentions
    probs: dict = {}
    out = m(output_attentions=True, hooks=_keep_patterns(probs), **inputs)
    grads = torch.autograd.grad(out.hidden.square().sum(),
                                [probs[f"blocks.{i}.attn.hook_pattern"] for i in range(2)])
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    torch.testing.assert_close(out.attentions.detach(), ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_lrp_rules_leave_the_forward_unchanged(family):
    """core.explain's rules change gradients only: inside lrp_rules the outputs are the same numbers."""
    from attn_explorer.core.explain import lrp_rules

    m, inputs = tiny(family)
    with torch.no_grad():
        ref = m(**inputs).hidden
    with torch.enable_grad(), lrp_rules():
        out = m(**inputs).hidden
    assert out.requires_grad
    torch.testing.assert_close(out.detach(), ref, atol=2e-6, rtol=1e-5)


def _keep_patterns(store: dict, layers=(0, 1)) -> Hooks:
    """Hooks that keep each layer's hook_pattern in store[name], in the autograd graph (asking for the pattern
    also forces the explicit, differentiable path)."""
    return Hooks(merge({f"blocks.{i}.attn.hook_pattern": caching_hook(store, detach=False) for i in layers}))


def _log_prob(m, inputs, token=5, **kw):
    out = m(**inputs, **kw)
    return F.log_softmax(m.logits(out.hidden[:, -1]), -1)[:, token].sum()


def test_gradient_of_an_attention_entry_matches_central_differences():
    """∂ log p / ∂A[layer, head, i, j] from autograd against a central difference in float64. Moving A[h, i, j]
    by ε moves head h's output at query i by ε·v_j, which the layer's head hook does. GPT-2: RMSNorm (Llama)
    computes in float32 whatever the weights, too coarse for differences in float64."""
    m, inputs = tiny("gpt2")
    m.double()
    layer, h, i, j, eps = 0, 3, 5, 2, 1e-6
    probs: dict = {}
    lp = _log_prob(m, inputs, hooks=_keep_patterns(probs, [layer]))
    grad = torch.autograd.grad(lp, probs[f"blocks.{layer}.attn.hook_pattern"])[0][:, h, i, j]

    def moved(e):
        cap = {}

        def hook(z, name):  # z (B, N, H, d): every head's output before W_O
            z = z.clone()
            z[:, i, h] += e * cap[f"blocks.{layer}.attn.hook_v"][:, j, h]  # GPT-2: a value head per head
            return z

        a = f"blocks.{layer}.attn."
        hooks = Hooks(merge({a + "hook_v": caching_hook(cap), a + "hook_z": hook}))
        with torch.no_grad():
            return _log_prob(m, inputs, hooks=hooks)

    fd = (moved(eps) - moved(-eps)) / (2 * eps)
    assert grad.sum().abs() > 1e-4  # a real signal, not two zeros agreeing
    torch.testing.assert_close(grad.sum(), fd, atol=1e-7, rtol=1e-6)


def test_gradient_of_dk_scale_matches_central_differences():
    """The d_k slider as a float64 tensor: d log p / d dk_scale through every layer's maps, against central differences."""
    m, inputs = tiny("gpt2")
    m.double()
    dk = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    # a hook on the pattern (changing nothing) forces the explicit, differentiable path
    explicit = Hooks(merge({f"blocks.{i}.attn.hook_pattern": lambda p, name: None for i in range(2)}))
    (grad,) = torch.autograd.grad(_log_prob(m, inputs, dk_scale=dk, hooks=explicit), dk)
    eps = 1e-6
    with torch.no_grad():
        fd = (_log_prob(m, inputs, dk_scale=1.3 + eps, hooks=explicit)
              - _log_prob(m, inputs, dk_scale=1.3 - eps, hooks=explicit)) / (2 * eps)
    assert abs(float(grad)) > 1e-4
    torch.testing.assert_close(grad, fd, atol=1e-7, rtol=1e-6)


def planted_vit(patch: int):
    """A 1-block tiny ViT and an image where only `patch` can matter: every other patch, [CLS] and the positions
    are zero vectors, and no projection has a bias, so the rest carry nothing; q = 0 makes attention uniform."""
    torch.manual_seed(3)
    m = VisionTransformer(ViTConfig(image_size=8, patch_size=2, dim=24, num_layers=1, num_heads=4, mlp_hidden=32,
                                    num_labels=3, qkv_bias=False, patch_bias=False)).eval()
    with torch.no_grad():
        m.pos_embed.zero_()
        m.cls_token.zero_()
        m.blocks.layers[0].attn.query.weight.zero_()
    img = torch.zeros(1, 3, 8, 8)
    r, c = divmod(patch, 4)
    img[:, :, 2 * r:2 * r + 2, 2 * c:2 * c + 2] = torch.randn(1, 3, 2, 2) * 3
    return m, {"pixels": img}


@pytest.mark.parametrize("method", ["gradient_rollout", "attnlrp"])
def test_planted_patch_is_ranked_first(method):
    from attn_explorer.analysis.relevance import class_logit, token_relevance

    m, inputs = planted_vit(11)
    with torch.no_grad():
        cls = m(**inputs).logits.argmax(-1)
    rel, _ = token_relevance(wrap(m), inputs, class_logit(cls), method, [0])
    patches = rel[0, 1:]
    assert int(abs(patches).argmax()) == 11 and patches[11] > 0
    assert abs(patches[11]) > 10 * abs(np.delete(patches, 11)).max(initial=0)
    att, _ = token_relevance(wrap(m), inputs, class_logit(cls), "attention", [0])
    assert np.ptp(att[0, 1:]) < 1e-6  # raw attention is uniform here: it cannot tell


@pytest.mark.parametrize("method", ["gradient_rollout", "attnlrp", "rollout", "attention"])
def test_a_batch_gives_what_each_input_gives_alone(method):
    from attn_explorer.analysis.relevance import class_logit, token_relevance

    m, _ = tiny("deit")
    torch.manual_seed(1)
    pixels = torch.randn(3, 3, 8, 8)
    classes = torch.tensor([2, 0, 1])
    together, y = token_relevance(wrap(m), {"pixels": pixels}, class_logit(classes), method, [0, 1])
    for b in range(3):
        alone, y1 = token_relevance(wrap(m), {"pixels": pixels[b:b + 1]}, class_logit(classes[b:b + 1]), method,
                                    [0, 1])
        np.testing.assert_allclose(together[b], alone[0], atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(y[b], y1[0], atol=1e-5)
    with torch.inference_mode():  # the score of the differentiable pass is the dense in-place path's
        dense = m(pixels=pixels, output_attentions=True).logits.gather(1, classes[:, None])[:, 0]
    np.testing.assert_allclose(y, dense.numpy(), atol=1e-5)
