"""Issue 24 A: the decoder block's element-wise steps without their extra tensors (RoPE without rotate_half's cat,
the gated MLP's activation and product in place, the RMSNorm's steps into one float32 tensor, the residual sums
written into the branch) give the same numbers, bit for bit, as transformers' formulas and as the autograd path
(which keeps the plain steps), in float32, bfloat16 and float16; and nothing a hook holds is changed."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from attn_explorer.api.hooks import merge
from attn_explorer.core import attention, blocks, linear
from attn_explorer.core.attention import AttentionOptions
from attn_explorer.core.blocks import BlockConfig, TransformerBlock
from attn_explorer.core.hooks import Hooks
from attn_explorer.core.layers import MLP, RMSNorm, SwiGLU
from attn_explorer.core.positional import apply_rope, rope_tables

transformers = pytest.importorskip("transformers")
from transformers.models.gemma3 import modeling_gemma3 as gemma3  # noqa: E402
from transformers.models.llama import modeling_llama as llama  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _ops(fn) -> set[str]:
    """The aten ops fn runs (under inference_mode)."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


# ---- RoPE ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposed", [False, True])
def test_rope_equals_transformers_bit_for_bit(dtype, transposed):
    """q·cos + rotate_half(q)·sin, transformers' sum, to the bit: on (B, H, N, d) as the attention hands it over
    (a transposed view of (B, N, H, d)) and contiguous, with transformers' own (1, N, d) tables."""
    g = torch.Generator().manual_seed(0)
    shape = (2, 9, 3, 32) if transposed else (2, 3, 9, 32)
    q = (torch.randn(*shape, generator=g) * 3).to(dtype)
    q = q.transpose(1, 2) if transposed else q
    cfg = transformers.LlamaConfig(hidden_size=96, num_attention_heads=3, num_key_value_heads=3,
                                   max_position_embeddings=64)
    cos, sin = llama.LlamaRotaryEmbedding(cfg)(q.float(), torch.arange(9)[None])
    cos, sin = cos.to(dtype), sin.to(dtype)
    want, _ = llama.apply_rotary_pos_emb(q, q, cos, sin)
    with torch.inference_mode():
        got = apply_rope(q, (cos, sin))
    assert got.dtype == want.dtype and torch.equal(got, want)
    ours = rope_tables(9, 32, dtype=dtype)
    with torch.inference_mode():
        assert torch.equal(apply_rope(q, ours), q * ours[0] + llama.rotate_half(q) * ours[1])


@pytest.mark.parametrize("layout", ["half", "pairs", "pairs_in"])
@pytest.mark.parametrize("rotary", [16, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_without_autograd_equals_the_autograd_path(layout, rotary, dtype):
    """Every layout and partial rotary: the same bits as the path autograd takes (rotate_half and cat), and the
    gradient still flows there."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 7, 16, generator=g).to(dtype)
    tables = rope_tables(7, rotary, dtype=dtype)
    with torch.no_grad():
        fast = apply_rope(x, tables, layout)
    leaf = x.clone().requires_grad_(True)
    slow = apply_rope(leaf, tables, layout)
    assert torch.equal(fast, slow.detach())
    slow.float().sum().backward()
    assert leaf.grad is not None and leaf.grad.abs().sum() > 0


def test_rope_runs_no_cat_or_negation():
    """The rotation writes its halves into one tensor: no rotate_half (neg, cat) on the inference path."""
    x = torch.randn(1, 4, 64, 32).transpose(1, 2).bfloat16()
    tables = rope_tables(4, 32, dtype=torch.bfloat16)
    ops = _ops(lambda: apply_rope(x, tables))
    assert "aten::cat" not in ops and "aten::neg" not in ops


# ---- the gated MLP -------------------------------------------------------------------------------------------

def _swiglu(act: str, fused: bool, dtype, bias=False) -> SwiGLU:
    torch.manual_seed(0)
    m = SwiGLU(24, 40, bias=bias, act=act, fused=fused)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(std=0.4)
    return m.to(dtype)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "gelu", "relu", "quick_gelu"])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_mlp_in_place_equals_the_plain_steps(act, fused, dtype):
    """act(gate(x)) * up(x), then down: the in-place inference path against the autograd path's plain steps."""
    m = _swiglu(act, fused, dtype, bias=fused)
    x = (torch.randn(2, 5, 24) * 2).to(dtype)
    with torch.inference_mode():
        fast = m(x)
        gate, up = m.gate_up(x).chunk(2, -1) if fused else (m.gate(x), m.up(x))
        assert torch.equal(fast, m.down(m.act(gate) * up))
    leaf = x.clone().requires_grad_(True)
    slow = m(leaf)  # the autograd path: the plain steps, F.linear's products (float32: not the packed ones)
    slow.float().sum().backward()
    assert leaf.grad is not None and leaf.grad.abs().sum() > 0
    if dtype != torch.float32:
        assert torch.equal(fast, slow.detach())


def test_every_activation_has_its_in_place_form():
    from attn_explorer.core.layers import ACTIVATIONS, INPLACE_ACTIVATIONS

    assert set(INPLACE_ACTIVATIONS) == set(ACTIVATIONS)


@pytest.mark.parametrize("gated", [False, True])
def test_an_activation_set_in_place_of_the_mlps_is_the_one_used(gated):
    """A function put in `act` (as tests/hub/test_parity_clip_siglip.py swaps quick_gelu for gelu) is what runs,
    not the in-place form of the one the MLP was built with."""
    torch.manual_seed(0)
    m = _swiglu("silu", False, torch.float32) if gated else MLP(24, 40, act="quick_gelu")
    x = torch.randn(2, 5, 24)
    with torch.inference_mode():
        before = m(x)
        m.act = torch.tanh
        if not gated:
            m.fused_act = None
        after = m(x)
        h = m.act(m.gate(x)) * m.up(x) if gated else m.act(m.fc1(x))
        want = m.down(h) if gated else m.fc2(h)
    assert not torch.equal(before, after) and torch.equal(after, want)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu", "silu", "quick_gelu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mlp_activation_in_place_equals_the_plain_steps(act, dtype):
    """fc2(act(fc1(x))) (GPT-2, BERT, CLIP's quick_gelu): the activation in place gives the same bits."""
    torch.manual_seed(0)
    m = MLP(24, 40, act=act).to(dtype)
    x = (torch.randn(2, 5, 24) * 2).to(dtype)
    with torch.inference_mode():
        fast = m(x)
        h = m.fc1.packed(x, post=m.fused_act) if m.fused_act is not None else None
        assert torch.equal(fast, m.fc2(m.act(m.fc1(x)) if h is None else h))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_geglu_equals_transformers_gemma3_mlp(dtype, monkeypatch):
    monkeypatch.setattr(linear, "fast_path_enabled", False)  # F.linear's products, as transformers'
    m = _swiglu("gelu_tanh", False, dtype)
    cfg = transformers.Gemma3TextConfig(hidden_size=24, intermediate_size=40, hidden_activation="gelu_pytorch_tanh")
    ref = gemma3.Gemma3MLP(cfg).to(dtype)
    with torch.no_grad():
        for ours, theirs in ((m.gate, ref.gate_proj), (m.up, ref.up_proj), (m.down, ref.down_proj)):
            theirs.weight.copy_(ours.weight)
    x = (torch.randn(1, 6, 24) * 2).to(dtype)
    with torch.inference_mode():
        assert torch.equal(m(x), ref(x))


def test_gated_mlp_activation_is_in_place():
    m = _swiglu("gelu_tanh", False, torch.bfloat16)
    x = torch.randn(1, 6, 24).bfloat16()
    ops = _ops(lambda: m(x))
    assert "aten::gelu_" in ops and "aten::gelu" not in ops and "aten::mul_" in ops


# ---- RMSNorm -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("unit_offset", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposed", [False, True])
def test_rms_norm_equals_transformers_bit_for_bit_and_leaves_its_input(unit_offset, dtype, transposed):
    """Gemma 3's (1 + w) norm and Llama's, against transformers' modules, on contiguous input and on a transposed
    view (the q and k norms'); the input (a float32 one is the caller's own tensor) is unchanged."""
    torch.manual_seed(0)
    ours = RMSNorm(32, 1e-6, unit_offset=unit_offset)
    ref = gemma3.Gemma3RMSNorm(32, eps=1e-6) if unit_offset else llama.LlamaRMSNorm(32, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_(std=0.3)
        ref.weight.copy_(ours.weight)
    ours, ref = ours.to(dtype), ref.to(dtype)
    x = (torch.randn(2, 7, 3, 32) * 3).to(dtype)
    x = x.transpose(1, 2) if transposed else x
    before = x.clone()
    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            got, want = ours(x), ref(x)
        assert got.dtype == want.dtype == dtype and torch.equal(got, want)
        assert got.stride() == want.stride()
        assert torch.equal(x, before)
    slow = ours(x.clone().requires_grad_(True))  # the autograd path (torch's rms_norm)
    assert torch.equal(slow.detach(), want)



@pytest.mark.parametrize("unit_offset", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["rows", "heads_transposed"])
def test_a_long_inputs_rms_norm_runs_in_row_blocks_with_the_same_bits(unit_offset, dtype, layout, monkeypatch):
    """Issue 24 A: from 2 · NORM_BLOCK_ROWS rows the steps run a block of rows at a time, so their float32 tensors
    stay in the cache (measured at 16,384 tokens, Gemma 3's shapes, bfloat16: 1.4× faster a norm): the same bits
    as transformers' module, the same strides, and the input unchanged."""
    from attn_explorer.core import layers

    torch.manual_seed(0)
    dim = 96 if layout == "rows" else 32
    ours = RMSNorm(dim, 1e-6, unit_offset=unit_offset)
    ref = gemma3.Gemma3RMSNorm(dim, eps=1e-6) if unit_offset else llama.LlamaRMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_(std=0.3)
        ref.weight.copy_(ours.weight)
    ours, ref = ours.to(dtype), ref.to(dtype)
    n = 2 * layers.NORM_BLOCK_ROWS + 5
    x = (torch.randn(1, n, 96) * 3).to(dtype) if layout == "rows" else \
        (torch.randn(1, n, 3, 32) * 3).to(dtype).transpose(1, 2)  # (B, H, N, d) as the q and k norms get it
    before = x.clone()
    blocks = []
    real = RMSNorm._steps
    monkeypatch.setattr(RMSNorm, "_steps", lambda self, *a: blocks.append(1) or real(self, *a))
    with torch.inference_mode():
        got, want = ours(x), ref(x)
    assert len(blocks) == 3
    assert got.dtype == want.dtype == dtype and torch.equal(got, want)
    assert got.stride() == want.stride()
    assert torch.equal(x, before)

# ---- the block: residual sums --------------------------------------------------------------------------------

def gemma3_shaped_block(dtype, dim: int = 32, mlp: int = 48, head_dim: int = 16, std: float = 0.2) -> TransformerBlock:
    """A Gemma 3 block (4 query heads on 1 key-value head, QK-norm, sandwich norms, GeGLU) with random weights, norm
    gains included; benchmarks/bench_elementwise.py builds Gemma 3 270M's shapes with it."""
    torch.manual_seed(0)
    cfg = BlockConfig(dim, 4, mlp, eps=1e-6, norm="rms1p", mlp="swiglu", mlp_act="gelu_tanh", qkv_bias=False,
                      mlp_bias=False, attn_out_bias=False, num_kv_heads=1, head_dim=head_dim, qk_norm=True,
                      sandwich=True)
    b = TransformerBlock(cfg).eval()
    with torch.no_grad():
        for name, p in b.named_parameters():
            p.normal_(std=0.3 if "norm" in name else std)
    return b.to(dtype)


def _opts(dtype, hooks=None) -> AttentionOptions:
    return AttentionOptions(causal=True, rope=rope_tables(11, 16, 50.0, dtype=dtype), scale=0.3, window=5,
                            hooks=hooks)


def _plain_rope(x, tables, layout="half"):
    cos, sin = tables
    return x * cos + llama.rotate_half(x) * sin  # transformers' apply_rotary_pos_emb


def _plain_norm(self, x):  # transformers' Gemma3RMSNorm
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
    return (y * (1.0 + self.weight.float())).type_as(x)


def _plain_mlp(self, x):  # transformers' Gemma3MLP
    return self.down(self.act(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lazy", [False, True])
def test_gemma3_block_equals_its_plain_steps(dtype, lazy, monkeypatch):
    """A Gemma 3-shaped block (q/k norms, RoPE, sandwich norms, GeGLU, a window), as it runs, against the same block
    with transformers' plain steps put in its place (rotate_half and cat, x.float() ... .type_as, act(gate) * up,
    x + branch): the same bits, dense and lazy (a lazy run's layer has LayerHooks without functions). Its input is
    left as it was."""
    b = gemma3_shaped_block(dtype)
    x = (torch.randn(1, 11, 32) * 2).to(dtype)
    before = x.clone()

    def run():
        with torch.inference_mode():
            return b(x, _opts(dtype, Hooks(keep=True).layer(0) if lazy else None))[0]

    fast = run()
    assert torch.equal(x, before)
    monkeypatch.setattr(attention, "apply_rope", _plain_rope)
    monkeypatch.setattr(RMSNorm, "forward", _plain_norm)
    monkeypatch.setattr(SwiGLU, "forward", _plain_mlp)
    monkeypatch.setattr(blocks, "_residual", lambda x, branch, lh, point: x + branch)
    assert torch.equal(fast, run())


@pytest.mark.parametrize("kind", ["parallel", "post_ln", "one_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parallel_and_post_ln_residuals_equal_the_plain_sums(kind, dtype, monkeypatch):
    """GPT-NeoX's (x + a) + m, Cohere's one-norm parallel block and BERT's norm(x + a): the same bits with the sums
    written into the branches as with x + branch."""
    torch.manual_seed(0)
    kw = {"parallel": dict(parallel=True), "post_ln": dict(norm_first=False),
          "one_norm": dict(parallel=True, one_norm=True, norm="layer_nobias")}[kind]
    b = TransformerBlock(BlockConfig(32, 4, 48, **kw)).eval().to(dtype)
    x = torch.randn(2, 7, 32).to(dtype)
    before = x.clone()
    with torch.inference_mode():
        fast = b(x, AttentionOptions(causal=True))[0]
        monkeypatch.setattr(blocks, "_residual", lambda x, branch, lh, point: x + branch)
        assert torch.equal(fast, b(x, AttentionOptions(causal=True))[0])
    assert torch.equal(x, before)


EVERY = ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "hook_resid_post")


@pytest.mark.parametrize("points", [("hook_attn_out",), ("hook_mlp_out",), ("hook_resid_pre",), ("hook_resid_post",),
                                    EVERY])
def test_hooked_tensors_are_not_changed_after_the_hook(points):
    """A hook that keeps a reference (no copy, as caching_hook does) on some points: what it kept is still what
    the point held when the hook saw it (the sums go in place only where no hook is), and the output is the
    unhooked one. With every point hooked: resid_post = (resid_pre + attn_out) + mlp_out, as the docstring says."""
    b = gemma3_shaped_block(torch.bfloat16)
    x = (torch.randn(1, 11, 32) * 2).bfloat16()
    kept: dict = {}

    def keep(t, name):
        kept[name] = (t, t.clone())

    hooks = Hooks(merge({f"blocks.0.{p}": keep for p in points}))
    with torch.inference_mode():
        out, _ = b(x, _opts(torch.bfloat16, hooks.layer(0)))
        plain, _ = b(x, _opts(torch.bfloat16))
    assert torch.equal(out, plain)
    assert sorted(kept) == sorted(f"blocks.0.{p}" for p in points)
    for name, (ref, copy) in kept.items():
        assert torch.equal(ref, copy), name
    if points == EVERY:
        c = {p: kept[f"blocks.0.{p}"][1] for p in EVERY}
        assert torch.equal((c["hook_resid_pre"] + c["hook_attn_out"]) + c["hook_mlp_out"], c["hook_resid_post"])
        assert torch.equal(c["hook_resid_post"], out)


def test_float32_rms_norm_leaves_a_shared_input():
    """float32 in: x.float() is x itself; the norm must not write into it (the residual stream a hook may hold)."""
    norm = RMSNorm(16, unit_offset=True)
    x = torch.randn(2, 3, 16)
    keep = x.clone()
    with torch.inference_mode():
        y = norm(x)
    assert torch.equal(x, keep) and y.data_ptr() != x.data_ptr()
    assert torch.equal(y, F.rms_norm(x, (16,), 1.0 + norm.weight.detach(), norm.eps))
