"""core.mamba2: the Mamba-2 mixer against transformers' own mixer modules (Granite 4's and Falcon-H1's) with the
same random weights, the three forms of the scan against each other, and the implicit map: A @ x reproduces the
mixer's output before the D skip, the gate and the norm (1e-5 relative), a decay that nearly vanishes included."""
from __future__ import annotations

import pytest
import torch

from attn_explorer.core.attention import AttentionOptions
from attn_explorer.core.mamba2 import (Mamba2Config, Mamba2Mixer, MambaState, implicit_map, implicit_tile,
                                       scan_chunked, scan_recurrent)

TOL = 1e-5


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def _randomise(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if "A_log" in name or "dt_bias" in name else 0.3))


def _granite(n_groups=2, chunk=4, **extra):
    from transformers import GraniteMoeHybridConfig
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMambaLayer
    hf_cfg = GraniteMoeHybridConfig(hidden_size=16, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=6,
                                    mamba_n_groups=n_groups, mamba_d_conv=4, mamba_chunk_size=chunk, mamba_expand=2,
                                    num_hidden_layers=1, layer_types=["mamba"], rms_norm_eps=1e-6, **extra)
    theirs = GraniteMoeHybridMambaLayer(hf_cfg, 0).eval()
    _randomise(theirs)
    ours = Mamba2Mixer(Mamba2Config(16, 4, 8, 6, n_groups=n_groups, chunk_size=chunk, eps=1e-6, conv_bias=True,
                                    dt_min=hf_cfg.time_step_limit[0], dt_max=hf_cfg.time_step_limit[1],
                                    norm_rounds=True))
    ours.hf_cfg = hf_cfg
    ours.load_state_dict(theirs.state_dict())
    return ours.eval(), theirs


def _falcon(rms_norm, before=True):
    from transformers import FalconH1Config
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer, compute_mup_vector
    mups = [0.7, 1.3, 0.9, 1.1, 0.6]
    hf_cfg = FalconH1Config(hidden_size=16, mamba_n_heads=4, mamba_d_head=8, mamba_d_ssm=32, mamba_d_state=6,
                            mamba_n_groups=2, mamba_chunk_size=4, num_hidden_layers=1, mamba_rms_norm=rms_norm,
                            mamba_norm_before_gate=before, ssm_multipliers=mups, ssm_in_multiplier=1.7,
                            num_attention_heads=4, num_key_value_heads=2)
    theirs = FalconH1Mixer(hf_cfg, 0).eval()
    theirs.register_buffer("mup_vector", compute_mup_vector(hf_cfg), persistent=False)
    _randomise(theirs, 1)
    kind = ("norm_first" if before else "gate_first") if rms_norm else "gate_only"
    ours = Mamba2Mixer(Mamba2Config(16, 4, 8, 6, n_groups=2, chunk_size=4, eps=hf_cfg.rms_norm_eps, norm=kind,
                                    in_scale=1.7, mup=tuple(mups)))
    ours.hf_cfg = hf_cfg
    ours.load_state_dict(theirs.state_dict())
    return ours.eval(), theirs


def _x(n=11, seed=3):
    return torch.randn(2, n, 16, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("groups", [1, 2])
def test_granite_mixer_equals_transformers(groups):
    ours, theirs = _granite(groups)
    x = _x()
    with torch.no_grad():
        want = theirs(x)
        got, _ = ours(x)
    print(f"granite mixer (groups {groups}): {float((got - want).abs().max()):.2e}")
    assert torch.allclose(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("rms_norm,before", [(True, True), (True, False), (False, True)])
def test_falcon_mixer_equals_transformers(rms_norm, before):
    ours, theirs = _falcon(rms_norm, before)
    x = _x()
    with torch.no_grad():
        want = theirs(x)
        got, _ = ours(x)
    print(f"falcon mixer (rms_norm {rms_norm}, before {before}): {float((got - want).abs().max()):.2e}")
    assert torch.allclose(got, want, atol=TOL, rtol=0)


def test_granite_dt_limit_clamps_like_transformers():
    ours, theirs = _granite(time_step_limit=(0.2, 0.9))
    x = _x()
    with torch.no_grad():
        assert torch.allclose(ours(x)[0], theirs(x), atol=TOL, rtol=0)


def _quantities(mixer, x):
    with torch.no_grad():
        z, xs, dt, B, C, _ = mixer.project(x)
    return xs, dt, B, C


def test_recurrent_chunked_and_map_agree():
    ours, _ = _granite()
    xs, dt, B, C = _quantities(ours, _x(13))
    A = ours.A.detach()
    y_rec, h_rec = scan_recurrent(xs, dt, A, B, C)
    y_chk, h_chk = scan_chunked(xs, dt, A, B, C, chunk=5)
    amap = implicit_map(dt, A, B, C)  # (b, H, N, N)
    y_map = torch.einsum("bhts,bshp->bthp", amap, xs)
    for y in (y_chk, y_map):
        assert _rel(y, y_rec) < TOL
    assert _rel(h_chk, h_rec) < TOL
    assert torch.all(amap.triu(1) == 0)
    assert (amap < 0).any()  # signed: C·B takes both signs


def test_map_times_x_is_the_pre_gate_output_with_a_vanishing_decay():
    """A decay that nearly vanishes (A_log large: exp(dt·A) ~ 1e-30 per step) and one that barely decays."""
    ours, _ = _granite()
    with torch.no_grad():
        ours.A_log.copy_(torch.tensor([5.0, -6.0, 0.0, 3.0]))
    x = _x(17)
    xs, dt, B, C = _quantities(ours, x)
    amap = implicit_map(dt, ours.A.detach(), B, C)
    y_ref, _ = scan_recurrent(xs, dt, ours.A.detach(), B, C)
    y_map = torch.einsum("bhts,bshp->bthp", amap, xs)
    print(f"implicit map x X: {_rel(y_map, y_ref):.2e} relative")
    assert _rel(y_map, y_ref) < TOL
    # head 0 forgets at once: its map is (nearly) the diagonal
    off = amap[:, 0].tril(-1).abs().max() / amap[:, 0].diagonal(dim1=-2, dim2=-1).abs().max()
    assert off < 1e-6
    # the map the mixer returns is this one, and it is what weighs x
    with torch.no_grad():
        out, returned = ours(x, AttentionOptions(need_weights=True))
        assert _rel(returned, amap) < TOL and _rel(out, ours(x)[0]) < TOL


def test_tiles_equal_the_dense_map():
    ours, _ = _granite()
    xs, dt, B, C = _quantities(ours, _x(15))
    amap = implicit_map(dt, ours.A.detach(), B, C)
    tile = implicit_tile(dt, ours.A.detach(), B, C, slice(6, 13), slice(2, 9))
    assert _rel(tile, amap[..., 6:13, 2:9]) < TOL


def test_generation_state_equals_one_pass():
    """Prefill 7 tokens, then one token at a time: the same outputs as one pass over all of them, and each
    step's map row (from the kept B and dt) is the whole pass's row."""
    ours, theirs = _granite()
    x = _x(12)
    with torch.no_grad():
        whole, amap = ours(x, AttentionOptions(need_weights=True))
        state = MambaState()
        parts = [ours(x[:, :7], AttentionOptions(kv=state, need_weights=True))[0]]
        for t in range(7, 12):
            out, row = ours(x[:, t:t + 1], AttentionOptions(kv=state, need_weights=True))
            parts.append(out)
            assert row.shape == (2, 4, 1, t + 1) and _rel(row[:, :, 0], amap[:, :, t, :t + 1]) < TOL
    assert state.length == 12
    assert torch.allclose(torch.cat(parts, 1), whole, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="prefix reuse"):
        state.truncate(5)


def test_ablating_a_head_through_hook_z():
    ours, _ = _granite()
    x = _x()
    from attn_explorer.core.hooks import Hooks

    def zero_head(t, name):
        t = t.clone()
        t[:, :, 2] = 0
        return t
    with torch.no_grad():
        base, _ = ours(x)
        ablated, _ = ours(x, AttentionOptions(hooks=Hooks({"blocks.0.attn.hook_z": (zero_head,)}).layer(0)))
        # by hand: the same y + D x with head 2 zeroed, then the norm and out_proj
        z, xs, dt, B, C, _ = ours.project(x)
        y = scan_recurrent(xs, dt, ours.A, B, C)[0] + ours.skip(xs)
        y = ours.norm(y.reshape(2, x.shape[1], -1), z)
        y[..., 16:24] = 0  # head 2's channels of out_proj's input
        want = ours.out_proj(y)
    assert not torch.allclose(ablated, base, atol=1e-3)
    assert torch.allclose(ablated, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("which", ["granite", "falcon norm before gate", "falcon gate before norm", "falcon no norm"])
def test_a_bfloat16_generation_step_equals_transformers_bit_for_bit(which):
    """A bfloat16 model: prefill 7 tokens, then 5 one at a time through the recurrent cache, against transformers'
    mixer with its cache. Its step (the torch selective update) rounds dt·B, ·x, the read-out, the D skip and
    Granite's normed output to bfloat16, its plain gate silu(z) in bfloat16; ours rounds at the same places, so
    the prefill and every step are equal, bit for bit."""
    import transformers
    ours, theirs = _granite() if which == "granite" else _falcon("no norm" not in which, "before gate" in which)
    ours, theirs = ours.to(torch.bfloat16), theirs.to(torch.bfloat16)
    cache, state = transformers.DynamicCache(config=ours.hf_cfg), MambaState()
    x = _x(12).to(torch.bfloat16)
    with torch.no_grad():
        want = [theirs(x[:, :7], cache=cache)] + [theirs(x[:, t:t + 1], cache=cache) for t in range(7, 12)]
        got = [ours(x[:, :7], AttentionOptions(kv=state))[0]] + [ours(x[:, t:t + 1], AttentionOptions(kv=state))[0]
                                                                 for t in range(7, 12)]
    steps = [float((a.float() - b.float()).abs().max()) for a, b in zip(got, want)]
    print(f"{which}: bfloat16 prefill and steps, max |ours - transformers| {steps}")
    assert got[0].dtype == torch.bfloat16 and steps == [0.0] * 6
