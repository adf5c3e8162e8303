"""Multi-head latent attention (core.mla) against transformers' DeepseekV3Attention with the same random
weights: maps and output within 1e-5 in float32, with and without a query latent, interleaved and half RoPE,
YaRN with mscale; lazy keeps the latent and its tiles equal the dense maps; LatentKeys index like a tensor."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attn_explorer.core import lazy  # noqa: E402
from attn_explorer.core.attention import AttentionOptions, LayerKV, key_padding_mask  # noqa: E402
from attn_explorer.core.hooks import Hooks, LayerHooks  # noqa: E402
from attn_explorer.core.mla import LatentKeys, LatentKV, MLAConfig, MultiHeadLatentAttention, yarn_mscale  # noqa: E402
from attn_explorer.core.positional import RopeScaling, rope_tables  # noqa: E402

from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds  # noqa: E402

TOL = 1e-5
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 0.8,
        "mscale_all_dim": 0.7, "beta_fast": 8, "beta_slow": 1, "rope_theta": 1000.0}
CASES = {
    "q-latent, interleaved": dict(q_lora_rank=12, rope_interleave=True),
    "plain q, half": dict(q_lora_rank=None, rope_interleave=False),
    "yarn mscale, bias": dict(q_lora_rank=10, rope_interleave=True, rope_parameters=YARN, attention_bias=True),
    "d_v > d_qk": dict(q_lora_rank=None, rope_interleave=True, v_head_dim=20),
}


def _pair(name):
    torch.manual_seed(sorted(CASES).index(name))
    kw = dict(vocab_size=50, hidden_size=32, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=6,
              qk_rope_head_dim=4, v_head_dim=8, max_position_embeddings=64, attn_implementation="eager")
    cfg = transformers.DeepseekV3Config(**{**kw, **CASES[name]})
    hf = ds.DeepseekV3Attention(cfg, 0).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():  # the latent norms' weights too
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "layernorm" in n else 0.0))
    p = cfg.rope_parameters
    scale = cfg.qk_head_dim ** -0.5
    scaling = RopeScaling()
    if p.get("rope_type") == "yarn":
        scale *= yarn_mscale(p["factor"], p["mscale_all_dim"]) ** 2
        scaling = RopeScaling("yarn", factor=p["factor"], original_positions=16, max_positions=64,
                              mscale=p["mscale"], mscale_all_dim=p["mscale_all_dim"], beta_fast=8, beta_slow=1)
    mla = MLAConfig(kv_lora_rank=16, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=cfg.v_head_dim,
                    q_lora_rank=cfg.q_lora_rank, bias=cfg.attention_bias, scale=scale)
    ours = MultiHeadLatentAttention(32, 4, mla, "pairs_in" if cfg.rope_interleave else "half").eval()
    names = {"q_proj": "query", "q_a_proj": "query_down", "q_a_layernorm": "query_norm", "q_b_proj": "query_up",
             "kv_a_proj_with_mqa": "kv_down", "kv_a_layernorm": "kv_norm", "kv_b_proj": "kv_up", "o_proj": "out"}
    sd = {names[k.split(".")[0]] + "." + k.split(".", 1)[1]: v for k, v in hf.state_dict().items()}
    ours.load_state_dict(sd, strict=True)
    rope = rope_tables(64, 4, p.get("rope_theta", 10000.0), scaling=scaling)
    return cfg, hf, ours, rope


def _reference(cfg, hf, x, mask=None):
    n = x.shape[1]
    pos = torch.arange(n)[None]
    cos_sin = ds.DeepseekV3RotaryEmbedding(cfg)(x, pos)
    add = torch.full((n, n), float("-inf")).triu(1)[None, None]
    if mask is not None:
        add = add.masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
    with torch.no_grad():
        return hf(x, cos_sin, add)


@pytest.mark.parametrize("name", list(CASES))
def test_maps_and_output_equal_transformers(name):
    cfg, hf, ours, (cos, sin) = _pair(name)
    x = torch.randn(2, 11, 32)
    ref_out, ref_maps = _reference(cfg, hf, x)
    opts = AttentionOptions(causal=True, need_weights=True, rope=(cos[:11], sin[:11]))
    with torch.no_grad():
        out, maps = ours(x, opts)
        fused, none = ours(x, AttentionOptions(causal=True, rope=(cos[:11], sin[:11])))
    print(f"{name}: maps {(maps - ref_maps).abs().max():.2e} out {(out - ref_out).abs().max():.2e}")
    assert none is None
    assert (maps - ref_maps).abs().max() <= TOL and (out - ref_out).abs().max() <= TOL
    assert (fused - ref_out).abs().max() <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_the_kv_cache_gives_the_full_forward(name):
    _, _, ours, (cos, sin) = _pair(name)
    x = torch.randn(1, 9, 32)
    with torch.no_grad():
        whole, maps = ours(x, AttentionOptions(causal=True, need_weights=True, rope=(cos[:9], sin[:9])))
        kv = LayerKV()
        a, _ = ours(x[:, :6], AttentionOptions(causal=True, rope=(cos[:6], sin[:6]), kv=kv))
        b, last = ours(x[:, 6:], AttentionOptions(causal=True, need_weights=True, rope=(cos[6:9], sin[6:9]), kv=kv))
    torch.testing.assert_close(torch.cat([a, b], dim=1), whole, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(last, maps[:, :, 6:], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_a_latent_cache_keeps_the_latent_and_gives_the_full_forward(name):
    _, _, ours, (cos, sin) = _pair(name)
    x = torch.randn(1, 9, 32)
    with torch.no_grad():
        whole, maps = ours(x, AttentionOptions(causal=True, need_weights=True, rope=(cos[:9], sin[:9])))
        kv = LatentKV()
        a, _ = ours(x[:, :6], AttentionOptions(causal=True, rope=(cos[:6], sin[:6]), kv=kv))
        assert tuple(kv.k.shape) == (1, 1, 6, 16) and tuple(kv.v.shape) == (1, 1, 6, 4)  # latent, shared k_rope
        hooks = Hooks(keep=True)
        b, _ = ours(x[:, 6:], AttentionOptions(causal=True, rope=(cos[6:9], sin[6:9]), kv=kv,
                                              hooks=LayerHooks(hooks, 0)))
    assert not kv.expanded and kv.length == 9
    assert isinstance(hooks.kept[0].k, LatentKeys) and hooks.kept[0].k.shape == (1, 4, 9, 10)
    torch.testing.assert_close(torch.cat([a, b], dim=1), whole, atol=1e-6, rtol=1e-5)
    got = lazy.head_probs(hooks.kept[0].q, hooks.kept[0].k, hooks.kept[0].lse, hooks.kept[0].options, 1)
    torch.testing.assert_close(got, maps[0, 1, 6:], atol=1e-6, rtol=1e-5)


def test_a_hook_on_k_turns_the_latent_cache_into_every_heads_k_and_v():
    """The hooked step's replaced keys stay in the cache (as MultiHeadAttention's), so later steps see them."""
    _, _, ours, (cos, sin) = _pair("q-latent, interleaved")
    x = torch.randn(1, 8, 32)
    doubled = Hooks({"blocks.0.attn.hook_k": (lambda k, n: k * 2,)})
    runs = {}
    for kind in (LatentKV, LayerKV):
        kv = kind()
        with torch.no_grad():
            ours(x[:, :3], AttentionOptions(causal=True, rope=(cos[:3], sin[:3]), kv=kv))
            ours(x[:, 3:5], AttentionOptions(causal=True, rope=(cos[3:5], sin[3:5]), kv=kv,
                                              hooks=LayerHooks(doubled, 0)))
            runs[kind] = ours(x[:, 5:], AttentionOptions(causal=True, need_weights=True, rope=(cos[5:8], sin[5:8]),
                                                         kv=kv))
        if kind is LatentKV:
            assert kv.expanded and tuple(kv.k.shape) == (1, 4, 8, 10) and tuple(kv.v.shape) == (1, 4, 8, 8)
    for got, want in zip(runs[LatentKV], runs[LayerKV]):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_lazy_keeps_the_latent_and_its_tiles_are_the_maps(name):
    _, _, ours, (cos, sin) = _pair(name)
    x = torch.randn(2, 13, 32)
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, 10:] = 0
    base = dict(causal=True, rope=(cos[:13], sin[:13]), mask=key_padding_mask(mask), dk_scale=0.7)
    hooks = Hooks(keep=True)
    with torch.no_grad():
        out, maps = ours(x, AttentionOptions(need_weights=True, **base))
        lazy_out, none = ours(x, AttentionOptions(hooks=LayerHooks(hooks, 0), **base))
    assert none is None
    kept = hooks.kept[0]
    assert isinstance(kept.k, LatentKeys) and kept.k.shape == (2, 4, 13, 10)
    assert kept.k.numel() == 2 * 13 * (16 + 4)  # the latent and the shared k_rope, not 4 heads × 10
    torch.testing.assert_close(lazy_out[0], out[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lazy_out[1, :10], out[1, :10], atol=1e-6, rtol=1e-5)
    for b, rows in ((0, 13), (1, 10)):
        for h in range(4):
            got = lazy.head_probs(kept.q, kept.k, kept.lse, kept.options, h, batch=b)
            torch.testing.assert_close(got[:rows], maps[b, h, :rows], atol=1e-6, rtol=1e-5)


def test_latent_keys_index_like_the_keys_they_stand_for():
    _, _, ours, (cos, sin) = _pair("q-latent, interleaved")
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        q, k, v, latent, k_rope = ours.project(x, (cos[:7], sin[:7]))
        keys = LatentKeys(latent, k_rope, ours.key_weights())
        for index in ((1, 2), (0, slice(1, 3), slice(2, 5)), (slice(None), slice(None), slice(3, 7)), (-1, -1, 4)):
            torch.testing.assert_close(keys[index], k[index], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(keys.full(), k, atol=1e-6, rtol=1e-5)
    assert keys.shape == k.shape and keys.dtype == k.dtype
    with pytest.raises(IndexError):
        keys[0, 4]


def test_hooks_see_joined_q_and_k_and_d_v_wide_v_and_z():
    _, _, ours, (cos, sin) = _pair("d_v > d_qk")
    seen = {}

    def look(t, name):
        seen[name.rsplit(".", 1)[1]] = tuple(t.shape)

    hooks = Hooks({f"blocks.0.attn.hook_{p}": (look,) for p in ("q", "k", "v", "z")})
    with torch.no_grad():
        ours(torch.randn(1, 5, 32), AttentionOptions(causal=True, rope=(cos[:5], sin[:5]), hooks=LayerHooks(hooks, 0)))
    assert seen == {"hook_q": (1, 5, 4, 10), "hook_k": (1, 5, 4, 10), "hook_v": (1, 5, 4, 20), "hook_z": (1, 5, 4, 20)}
