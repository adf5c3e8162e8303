"""AttnLRP (analysis.relevance, method "attnlrp") conserves the explained logit where its rules are exact.

On a bias-free Llama (tests/tiny_llama: RMSNorm, RoPE, SwiGLU, no biases: no bias term absorbs relevance),
gradient × input at the first block's input sums to the logit explained, to float32 rounding, wherever the
relevance passes only rules that conserve it: the identity rule on RMSNorm (its divisor held), the identity
rule on SiLU with the uniform rule on act(gate)·up (a product of two linear-like inputs, each half), linear
layers without bias, and the residual stream. The softmax is where AttnLRP does not conserve (its rule
R_in = z ⊙ (R_out − s Σ R_out) leaves a bias share); with q·kᵀ ≡ 0 that share is known exactly: the softmax's
input z is 0, so it passes nothing, and the uniform rule on A·V sends half of each attention output's
relevance R_attn = Σ attn_out ⊙ ∂y/∂attn_out to A (lost) and half to V. So Σ R_in = y − ½ Σ_layers R_attn.

Tolerance: the sums are of a few thousand float32 products of size ~1-10 (22 tokens × 64 dims, 2 layers):
float32 keeps ~7 digits, so the sums agree to ~1e-5 of their magnitude on any x86 CPU (the summation order
of BLAS kernels differs between Intel and AMD, not the precision); 1e-4 of (|y| + Σ|R|) leaves a 10x margin,
and is far below the gaps a wrong rule leaves (a missing half on A·V or MLP: ~1e-1 of y).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attn_explorer as ax
from attn_explorer.analysis.relevance import explain
from tests.tiny_llama import make_llama_folder

TEXT = "The capital of France is Paris. Attention lets"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("llama-lrp")))


def _model(folder, **zero):
    """The tiny Llama with the named weights of every layer set to 0 (e.g. out=True: W_O)."""
    m = ax.load_model(folder, device="cpu")
    with torch.no_grad():
        for block in m.module.blocks.layers:
            for name in zero:
                getattr(block.attn, name).weight.zero_()
    return m


def _close(total: float, y: float, scale: float) -> None:
    assert abs(total - y) <= 1e-4 * scale, (total, y, total - y)


def test_attnlrp_conserves_the_logit_through_norms_mlp_and_residual(folder):
    """Every attention output switched off (W_O = 0): only exact rules carry the relevance."""
    m = _model(folder, out=True)
    r = explain(m, TEXT, method="attnlrp")
    assert r.target.startswith("logit of") and abs(r.value) > 0.1  # a logit, not a log-probability
    _close(float(r.scores.astype(np.float64).sum()), r.value, abs(r.value) + float(np.abs(r.scores).sum()))


def test_attnlrp_through_attention_loses_exactly_the_softmaxs_half(folder):
    """q·kᵀ ≡ 0 (W_Q = W_K = 0, every row a uniform causal average): Σ R_in = y − ½ Σ_l R_attn,l, where
    R_attn,l is gradient × input at layer l's attention output under the same rules."""
    from attn_explorer.core.explain import lrp_rules

    m = _model(folder, query=True, key=True)
    r = explain(m, TEXT, method="attnlrp")
    L = len(m.module.blocks.layers)
    names = [f"blocks.{i}.hook_attn_out" for i in range(L)]
    patterns = [f"blocks.{i}.attn.hook_pattern" for i in range(L)]  # kept, as explain keeps them: the same path
    prep = m.prepare(TEXT)
    with torch.enable_grad(), lrp_rules():
        t = m.trace(prep, names=names + patterns, grad=True)
        logits = m.module.logits(t.out.hidden[:, -1]).float()
        y = logits[0, int(logits[0].argmax())]
        outs = [t.cache[n] for n in names]
        grads = torch.autograd.grad(y, outs)
    r_attn = [float((o.detach().double() * g.double()).sum()) for o, g in zip(outs, grads)]
    assert abs(float(y.detach()) - r.value) <= 1e-5 * abs(r.value)  # the same logit
    assert all(abs(a) > 1e-3 * abs(r.value) for a in r_attn)  # attention carries a share: the test can fail
    expected = r.value - 0.5 * sum(r_attn)
    _close(float(r.scores.astype(np.float64).sum()), expected, abs(r.value) + float(np.abs(r.scores).sum()))
