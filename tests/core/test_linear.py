"""The CPU fast path for linear layers: the same numbers as F.linear, and never a stale packed weight."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from attn_explorer.core import linear
from attn_explorer.core.attention import AttentionOptions, MultiHeadAttention
from attn_explorer.core.layers import MLP
from attn_explorer.core.linear import Linear

pytestmark = pytest.mark.skipif(not linear._ONEDNN, reason="this torch has no oneDNN linear")


@pytest.fixture(autouse=True)
def packed_path(monkeypatch):
    """These tests are about the packed path itself: forced, not left to the per-machine measurement."""
    monkeypatch.setattr(linear, "path_choice", "packed")


def test_measured_choice_is_made_once_per_shape_and_keeps_the_numbers(monkeypatch):
    """Issue 24 F: "measure" times the packed product against F.linear on the first call of each shape and keeps
    the faster; later calls of that shape do not measure again, and either way the numbers are F.linear's."""
    monkeypatch.setattr(linear, "path_choice", "measure")
    monkeypatch.setattr(linear, "_measured", {})
    calls = []
    real = linear.PackedLinears._packed_is_faster
    monkeypatch.setattr(linear.PackedLinears, "_packed_is_faster", lambda self, *a: calls.append(1) or real(self, *a))
    torch.manual_seed(0)
    a, b = Linear(24, 40), Linear(24, 40)
    x = torch.randn(1, 9, 24)
    with torch.no_grad():
        for layer in (a, b, a):
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        assert calls == [1] and list(linear._measured) == [(24, 40, "none", "", False)]
        Linear(24, 40)(torch.randn(1, 100, 24))  # a long input is a shape of its own
        assert len(calls) == 2
        for wins in (True, False):  # whichever won, the caller gets the same numbers
            linear._measured = {key: wins for key in linear._measured}
            torch.testing.assert_close(a(x), F.linear(x, a.weight, a.bias), atol=1e-5, rtol=1e-5)
        monkeypatch.setattr(linear, "path_choice", "plain")
        assert a.packed(x) is None  # forced plain: the caller runs F.linear


def _packed(layer: Linear) -> bool:
    return layer.packed.is_packed


def test_same_numbers_as_f_linear():
    torch.manual_seed(0)
    layer = Linear(48, 40)
    x = torch.randn(2, 9, 48)
    with torch.no_grad():
        y = layer(x)
    assert _packed(layer)
    torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


def test_in_place_edits_replacements_and_moves_repack():
    torch.manual_seed(0)
    layer = Linear(16, 8)
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        layer(x)
        layer.weight.mul_(3.0)  # in place: the version counter moves
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        layer.bias.zero_()
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight), atol=1e-5, rtol=1e-5)
        fresh = {"weight": torch.randn(8, 16), "bias": torch.randn(8)}
        layer.load_state_dict(fresh, assign=True)  # new tensors altogether
        torch.testing.assert_close(layer(x), F.linear(x, fresh["weight"], fresh["bias"]), atol=1e-5, rtol=1e-5)
        plus = {k: v + 1 for k, v in fresh.items()}
        layer.load_state_dict(plus)  # copied into the same tensors
        torch.testing.assert_close(layer(x), F.linear(x, plus["weight"], plus["bias"]), atol=1e-5, rtol=1e-5)
        layer.double()  # another dtype: plain F.linear, exact
        assert not _packed(layer)
        assert torch.equal(layer(x.double()), F.linear(x.double(), layer.weight, layer.bias))


def test_training_takes_autograd_path():
    torch.manual_seed(0)
    layer = Linear(6, 4)
    x = torch.randn(3, 6)
    layer(x).square().sum().backward()
    assert layer.weight.grad is not None and not _packed(layer)
    want = torch.autograd.grad(F.linear(x, layer.weight, layer.bias).square().sum(), layer.weight)[0]
    torch.testing.assert_close(layer.weight.grad, want)


def test_copies_carry_no_cache_and_stay_correct():
    torch.manual_seed(0)
    layer = Linear(8, 8)
    x = torch.randn(1, 3, 8)
    with torch.no_grad():
        layer(x)
        twin = copy.deepcopy(layer)
        assert not _packed(twin) and twin.packed.layers[0] is twin
        twin.weight.add_(1.0)
        torch.testing.assert_close(twin(x), F.linear(x, twin.weight, twin.bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu", "silu"])
def test_mlp_fused_activation_matches_plain(act, monkeypatch):
    torch.manual_seed(0)
    mlp = MLP(16, 64, act).eval()
    with torch.no_grad():
        for p in mlp.parameters():
            p.mul_(8.0)  # inputs to the activation at |x| ~ 1-10, where the GELU forms differ
        x = torch.randn(2, 5, 16)
        fast = mlp(x)
        monkeypatch.setattr(linear, "fast_path_enabled", False)
        plain = mlp(x)
    torch.testing.assert_close(fast, plain, atol=1e-4, rtol=1e-5)


def test_separate_qkv_run_as_one_product_and_follow_edits():
    torch.manual_seed(0)
    mha = MultiHeadAttention(24, 3).eval()
    x = torch.randn(1, 6, 24)
    with torch.no_grad():
        a, _ = mha(x, AttentionOptions(need_weights=True))
        assert mha.packed_qkv.is_packed and not _packed(mha.query)  # one packed copy, not four
        mha.key.weight.mul_(-1.0)
        b, pb = mha(x, AttentionOptions(need_weights=True))
        linear.fast_path_enabled = False
        try:
            c, pc = mha(x, AttentionOptions(need_weights=True))
        finally:
            linear.fast_path_enabled = True
    assert not torch.allclose(a, b)
    torch.testing.assert_close(b, c, atol=1e-5, rtol=0)
    torch.testing.assert_close(pb, pc, atol=1e-5, rtol=0)


def _rows_seen_by_onednn(monkeypatch) -> set[int]:
    """Spy on oneDNN's linear op: the row counts (all dimensions but the last) of the inputs it is given."""
    seen: set[int] = set()
    real = torch.ops.mkldnn._linear_pointwise

    def spy(x, *args):
        seen.add(x.numel() // x.shape[-1])
        return real(x, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    return seen


def test_onednn_sees_a_few_row_counts_not_one_per_length(monkeypatch):
    """oneDNN compiles and keeps a kernel per input shape (up to 1,024, ~0.5 MB each): a text box sending
    every length from 1 to 300 must not hand it 300 shapes. Rows are padded to a bucket."""
    seen = _rows_seen_by_onednn(monkeypatch)
    torch.manual_seed(0)
    layer = Linear(16, 8)
    with torch.no_grad():
        for n in range(1, 301):
            assert layer(torch.randn(1, n, 16)).shape == (1, n, 8)
    assert len(seen) <= 32, f"{len(seen)} row counts reached oneDNN"
    assert all(m % 8 == 0 for m in seen)


@pytest.mark.parametrize("shape", [(1, 1, 24), (1, 9, 24), (2, 13, 24), (65, 24), (1, 129, 24), (3, 100, 24)])
def test_padded_rows_give_the_same_numbers(shape, monkeypatch):
    """Padding the rows to a bucket and slicing them off again changes no kept row: the same as oneDNN on
    the exact rows, and as F.linear; one product for Q, K and V and a fused GELU included."""
    torch.manual_seed(0)
    x = torch.randn(*shape)
    layer = Linear(24, 40)
    mlp = MLP(24, 48, "gelu").eval()
    mha = MultiHeadAttention(24, 3).eval()
    runs = {}
    with torch.no_grad():
        for bucketed in (True, False):
            monkeypatch.setattr(linear, "bucketing_enabled", bucketed)
            qkv = mha.packed_qkv(x)
            runs[bucketed] = (layer(x), mlp(x), *qkv)
    for a, b in zip(runs[True], runs[False]):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    torch.testing.assert_close(runs[True][0], F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
    assert runs[True][0].shape == (*shape[:-1], 40)


needs_mkl = pytest.mark.skipif(not linear._MKL, reason="this torch has no MKL packed product")


@needs_mkl
@pytest.mark.parametrize("rows", [1, 7, 16, 100, 300])
def test_mkl_path_gives_f_linears_numbers_at_any_row_count(rows, monkeypatch):
    """Issue 24 F: MKL's packed product, packed once, serves every row count (no bucket padding) with F.linear's
    numbers: one layer, Q, K and V as one product, and an MLP whose activation runs after the product."""
    monkeypatch.setattr(linear, "path_choice", "mkl")
    torch.manual_seed(0)
    x = torch.randn(1, rows, 24)
    layer, mlp, mha = Linear(24, 40), MLP(24, 48, "gelu").eval(), MultiHeadAttention(24, 3).eval()
    with torch.no_grad():
        fast = (layer(x), mlp(x), *mha.packed_qkv(x))
        assert layer.packed._cache[3] == "mkl" and mha.packed_qkv._cache[3] == "mkl"
        monkeypatch.setattr(linear, "fast_path_enabled", False)
        plain = (layer(x), mlp(x), mha.query(x), mha.key(x), mha.value(x))
    for a, b in zip(fast, plain):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@needs_mkl
def test_a_changed_path_or_weight_repacks(monkeypatch):
    """The packed copy says which product it was packed for: a switch of path packs again, and an edit of the
    weight is seen on MKL's path as on oneDNN's."""
    torch.manual_seed(0)
    layer, x = Linear(24, 40), torch.randn(1, 5, 24)
    with torch.no_grad():
        for kind in ("mkl", "packed", "mkl"):
            monkeypatch.setattr(linear, "path_choice", kind)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
            assert layer.packed._cache[3] == kind
        layer.weight.mul_(-1.0)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


@needs_mkl
def test_auto_takes_mkls_product_on_intel_and_onednns_elsewhere(monkeypatch):
    """One path per machine, by the CPU's vendor, so every process there computes the same numbers; bfloat16
    always takes oneDNN's (MKL packs float32 only)."""
    monkeypatch.setattr(linear, "path_choice", "auto")
    for vendor, f32 in (("GenuineIntel", "mkl"), ("AuthenticAMD", "packed"), ("", "packed")):
        monkeypatch.setattr(linear, "cpu_vendor", lambda v=vendor: v)
        assert (linear._path(torch.float32), linear._path(torch.bfloat16)) == (f32, "packed")


def test_bf16_takes_f_linear_for_long_inputs_on_an_amx_cpu(monkeypatch):
    """Issue 24 B, measured on an Intel Xeon with AMX-BF16 (2026-12-03, 2 threads, interleaved): oneDNN's prepacked
    bfloat16 product is 1.0-1.45× slower than F.linear's at Gemma 3's shapes from 1,024 rows up, and 1.3× faster
    below; both give the same bits. So on an AMX CPU a long bfloat16 input takes F.linear and a short one the
    packed product; a CPU without AMX (AMD's avx512_bf16, where the packed product was faster) packs at every
    length."""
    monkeypatch.setattr(linear, "path_choice", "auto")
    monkeypatch.setattr(linear, "native_bf16", lambda: True)
    torch.manual_seed(0)
    layer = Linear(16, 24).bfloat16()
    for amx, rows, packs in ((True, linear.AMX_PLAIN_ROWS, False), (True, linear.AMX_PLAIN_ROWS - 1, True),
                             (False, linear.AMX_PLAIN_ROWS, True)):
        monkeypatch.setattr(linear, "amx_bf16", lambda amx=amx: amx)
        layer.packed.clear()
        x = torch.randn(1, rows, 16).bfloat16()
        with torch.no_grad():
            y = layer(x)
        assert layer.packed.is_packed == packs, (amx, rows)
        torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias), atol=1e-2, rtol=1e-2)
        assert linear._path(torch.bfloat16, rows) == ("packed" if packs else "plain")
    assert linear._path(torch.float32, linear.AMX_PLAIN_ROWS) == linear._path(torch.float32)  # float32 as before
