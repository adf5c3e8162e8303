"""core.moe against transformers' own MoE modules (Qwen3-MoE, gpt-oss, Llama 4, DeepSeek-V3), the same random
weights in both, float32 within 1e-5; and the routing the module hands its hook points."""
from __future__ import annotations

import pytest
import torch

from attn_explorer.core.moe import MoE, MoEConfig

transformers = pytest.importorskip("transformers")

TOL = 1e-5
D, T = 16, 11  # width, tokens (two sequences of T)


def _rand(*shape, scale=0.3):
    return torch.randn(*shape) * scale


def _hf_config(cls, **kw):
    cfg = cls(**kw)
    cfg._experts_implementation = "eager"
    return cfg


def _qwen3():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeConfig, Qwen3MoeSparseMoeBlock
    cfg = _hf_config(Qwen3MoeConfig, hidden_size=D, moe_intermediate_size=12, num_experts=6, num_experts_per_tok=2,
                     norm_topk_prob=True)
    hf = Qwen3MoeSparseMoeBlock(cfg)
    E, Ih = 6, 12
    ours = MoE(D, MoEConfig(num_experts=E, top_k=2, hidden=Ih, scoring="softmax", norm_topk=True))
    with torch.no_grad():
        hf.gate.weight.copy_(_rand(E, D, scale=1.0))
        hf.experts.gate_up_proj.copy_(_rand(E, 2 * Ih, D))
        hf.experts.down_proj.copy_(_rand(E, D, Ih))
        ours.router.weight.copy_(hf.gate.weight)
        for e in range(E):
            ours.experts[e].gate.weight.copy_(hf.experts.gate_up_proj[e, :Ih])
            ours.experts[e].up.weight.copy_(hf.experts.gate_up_proj[e, Ih:])
            ours.experts[e].down.weight.copy_(hf.experts.down_proj[e])
    return hf, ours, lambda x: hf(x)


def _qwen3_unnormalised():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeConfig, Qwen3MoeSparseMoeBlock
    cfg = _hf_config(Qwen3MoeConfig, hidden_size=D, moe_intermediate_size=8, num_experts=5, num_experts_per_tok=3,
                     norm_topk_prob=False)
    hf = Qwen3MoeSparseMoeBlock(cfg)
    ours = MoE(D, MoEConfig(num_experts=5, top_k=3, hidden=8))
    with torch.no_grad():
        hf.gate.weight.copy_(_rand(5, D, scale=1.0))
        hf.experts.gate_up_proj.copy_(_rand(5, 16, D))
        hf.experts.down_proj.copy_(_rand(5, D, 8))
        ours.router.weight.copy_(hf.gate.weight)
        for e in range(5):
            ours.experts[e].gate.weight.copy_(hf.experts.gate_up_proj[e, :8])
            ours.experts[e].up.weight.copy_(hf.experts.gate_up_proj[e, 8:])
            ours.experts[e].down.weight.copy_(hf.experts.down_proj[e])
    return hf, ours, lambda x: hf(x)


def _gpt_oss():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssConfig, GptOssMLP
    E, Ih = 4, 10
    cfg = _hf_config(GptOssConfig, hidden_size=D, intermediate_size=Ih, num_local_experts=E, num_experts_per_tok=2,
                     swiglu_limit=1.5)  # a low limit, so the clamps act on these small numbers
    cfg.swiglu_alpha = 1.702
    hf = GptOssMLP(cfg)
    ours = MoE(D, MoEConfig(num_experts=E, top_k=2, hidden=Ih, scoring="topk_softmax", router_bias=True,
                            act="clamped_swiglu", alpha=1.702, limit=1.5, expert_bias=True, stacked=True,
                            interleaved=True))
    with torch.no_grad():
        hf.router.weight.copy_(_rand(E, D, scale=1.0))
        hf.router.bias.copy_(_rand(E))
        hf.experts.gate_up_proj.copy_(_rand(E, D, 2 * Ih, scale=1.0))
        hf.experts.gate_up_proj_bias.copy_(_rand(E, 2 * Ih))
        hf.experts.down_proj.copy_(_rand(E, Ih, D))
        hf.experts.down_proj_bias.copy_(_rand(E, D))
        ours.router.weight.copy_(hf.router.weight)
        ours.router.bias.copy_(hf.router.bias)
        ours.experts.gate_up.copy_(hf.experts.gate_up_proj)
        ours.experts.gate_up_bias.copy_(hf.experts.gate_up_proj_bias)
        ours.experts.down.copy_(hf.experts.down_proj)
        ours.experts.down_bias.copy_(hf.experts.down_proj_bias)
    return hf, ours, lambda x: hf(x)[0]


def _llama4():
    from transformers.models.llama4.modeling_llama4 import Llama4TextConfig, Llama4TextMoe
    E, Ih = 4, 12
    cfg = _hf_config(Llama4TextConfig, hidden_size=D, intermediate_size=Ih, num_local_experts=E,
                     num_experts_per_tok=1, hidden_act="silu")
    hf = Llama4TextMoe(cfg)
    ours = MoE(D, MoEConfig(num_experts=E, top_k=1, hidden=Ih, scoring="sigmoid", weight_input=True,
                            shared_hidden=Ih, stacked=True))
    with torch.no_grad():
        hf.router.weight.copy_(_rand(E, D, scale=1.0))
        hf.experts.gate_up_proj.copy_(_rand(E, D, 2 * Ih))
        hf.experts.down_proj.copy_(_rand(E, Ih, D))
        for p in ("gate", "up", "down"):
            getattr(hf.shared_expert, f"{p}_proj").weight.copy_(_rand(*getattr(ours.shared, p).weight.shape))
            getattr(ours.shared, p).weight.copy_(getattr(hf.shared_expert, f"{p}_proj").weight)
        ours.router.weight.copy_(hf.router.weight)
        ours.experts.gate_up.copy_(hf.experts.gate_up_proj)
        ours.experts.down.copy_(hf.experts.down_proj)
    return hf, ours, lambda x: hf(x.reshape(-1, D))[0].view(x.shape)


def _deepseek(n_group=4, topk_group=2, norm=True, scaling=2.5, top_k=3):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Config, DeepseekV3MoE
    E, Ih = 8, 6
    cfg = _hf_config(DeepseekV3Config, hidden_size=D, moe_intermediate_size=Ih, n_routed_experts=E,
                     num_experts_per_tok=top_k, n_group=n_group, topk_group=topk_group, norm_topk_prob=norm,
                     routed_scaling_factor=scaling, n_shared_experts=2, hidden_act="silu")
    hf = DeepseekV3MoE(cfg)
    ours = MoE(D, MoEConfig(num_experts=E, top_k=top_k, hidden=Ih, scoring="sigmoid", norm_topk=norm,
                            choice_bias=True, n_group=n_group, topk_group=topk_group, scaling=scaling,
                            shared_hidden=2 * Ih))
    with torch.no_grad():
        hf.gate.weight.copy_(_rand(E, D, scale=1.0))
        hf.gate.e_score_correction_bias.copy_(_rand(E))
        hf.experts.gate_up_proj.copy_(_rand(E, 2 * Ih, D))
        hf.experts.down_proj.copy_(_rand(E, D, Ih))
        for p in ("gate", "up", "down"):
            getattr(hf.shared_experts, f"{p}_proj").weight.copy_(_rand(*getattr(ours.shared, p).weight.shape))
            getattr(ours.shared, p).weight.copy_(getattr(hf.shared_experts, f"{p}_proj").weight)
        ours.router.weight.copy_(hf.gate.weight)
        ours.router.choice_bias.copy_(hf.gate.e_score_correction_bias)
        for e in range(E):
            ours.experts[e].gate.weight.copy_(hf.experts.gate_up_proj[e, :Ih])
            ours.experts[e].up.weight.copy_(hf.experts.gate_up_proj[e, Ih:])
            ours.experts[e].down.weight.copy_(hf.experts.down_proj[e])
    return hf, ours, lambda x: hf(x)


KINDS = {
    "qwen3_moe": _qwen3,
    "qwen3_moe, k=3 unnormalised": _qwen3_unnormalised,
    "gpt_oss": _gpt_oss,
    "llama4": _llama4,
    "deepseek_v3": _deepseek,
    "deepseek_v3, one group, no norm": lambda: _deepseek(n_group=1, topk_group=1, norm=False, scaling=1.0, top_k=2),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_moe_matches_transformers(kind):
    torch.manual_seed(0)
    hf, ours, run_hf = KINDS[kind]()
    x = torch.randn(2, T, D)
    with torch.no_grad():
        want, got = run_hf(x), ours(x)
    diff = (want - got).abs().max().item()
    print(f"{kind}: moe out {diff:.1e} (|out| {want.abs().max().item():.2f})")
    assert got.shape == x.shape
    assert want.abs().max() > 0.1  # not a zero output agreeing with another
    assert diff < TOL


def test_every_kind_uses_more_than_one_expert():
    """Routing that sends every token to one expert would not test the choice."""
    for kind, make in KINDS.items():
        torch.manual_seed(0)
        _, ours, _ = make()
        indices, _ = ours.router(torch.randn(2 * T, D))
        assert indices.unique().numel() > 1, kind


def test_gpt_oss_clamp_acts():
    """The limit is low enough that the clamps change this test's numbers: without them the output differs."""
    torch.manual_seed(0)
    hf, ours, run_hf = _gpt_oss()
    x = torch.randn(2, T, D)
    unclamped = MoE(D, MoEConfig(**{**ours.cfg.__dict__, "limit": 1e9}))
    unclamped.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert (unclamped(x) - run_hf(x)).abs().max() > 1e-3


def test_deepseek_group_limit_and_choice_bias_act():
    """Group limiting and the choice bias each change which experts some token gets in the test above."""
    torch.manual_seed(0)
    _, ours, _ = _deepseek()
    x = torch.randn(2 * T, D)
    base = ours.router(x)[0].sort(-1).values
    free = MoE(D, MoEConfig(**{**ours.cfg.__dict__, "n_group": 1, "topk_group": 1}))
    free.load_state_dict(ours.state_dict())
    assert not torch.equal(free.router(x)[0].sort(-1).values, base)
    unbiased = MoE(D, ours.cfg)
    unbiased.load_state_dict(ours.state_dict())
    with torch.no_grad():
        unbiased.router.choice_bias.zero_()
    assert not torch.equal(unbiased.router(x)[0].sort(-1).values, base)


def test_state_dict_names():
    per = MoE(8, MoEConfig(num_experts=2, top_k=1, hidden=4, choice_bias=True, shared_hidden=6))
    assert set(per.state_dict()) == {"router.weight", "router.choice_bias", *(
        f"experts.{e}.{p}.weight" for e in range(2) for p in ("gate", "up", "down")),
        "shared.gate.weight", "shared.up.weight", "shared.down.weight"}
    stacked = MoE(8, MoEConfig(num_experts=2, top_k=1, hidden=4, router_bias=True, expert_bias=True, stacked=True,
                               interleaved=True, act="clamped_swiglu", scoring="topk_softmax"))
    sd = stacked.state_dict()
    assert set(sd) == {"router.weight", "router.bias", "experts.gate_up", "experts.gate_up_bias", "experts.down",
                       "experts.down_bias"}
    assert sd["experts.gate_up"].shape == (2, 8, 8) and sd["experts.down"].shape == (2, 4, 8)


class _Recorder:
    """A LayerHooks stand-in: records (and optionally replaces) what the module hands each point."""

    def __init__(self, replace=None):
        self.seen, self.replace = {}, replace or {}

    def __call__(self, point, x):
        self.seen[point] = x
        return self.replace.get(point, x)


def test_hooks_see_the_routing_and_may_replace_it():
    torch.manual_seed(0)
    _, ours, _ = _qwen3()
    x = torch.randn(2, T, D)
    rec = _Recorder()
    with torch.no_grad():
        out = ours(x, rec)
        assert torch.equal(out, ours(x))
    idx, w = rec.seen["mlp.hook_expert_indices"], rec.seen["mlp.hook_expert_weights"]
    assert idx.shape == (2, T, 2) and w.shape == (2, T, 2) and idx.dtype == torch.int64
    assert torch.allclose(w.sum(-1), torch.ones(2, T))  # norm_topk
    assert (w[..., 0] >= w[..., 1]).all()  # highest first
    # every token sent to expert 0 alone, weight 1: the output is expert 0's output
    forced = _Recorder({"mlp.hook_expert_indices": torch.zeros_like(idx),
                        "mlp.hook_expert_weights": torch.stack([torch.ones(2, T), torch.zeros(2, T)], -1)})
    with torch.no_grad():
        out = ours(x, forced)
        assert torch.allclose(out, ours.expert(0, x.reshape(-1, D)).view(x.shape), atol=1e-6)


def test_bad_configs_refused():
    with pytest.raises(ValueError, match="scoring"):
        MoEConfig(num_experts=4, top_k=1, hidden=4, scoring="argmax")
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(num_experts=4, top_k=5, hidden=4)
    with pytest.raises(ValueError, match="n_group"):
        MoEConfig(num_experts=6, top_k=1, hidden=4, n_group=4)


def test_block_and_llama_config_build_moe_on_the_marked_layers():
    from attn_explorer.core.blocks import BlockConfig, TransformerBlock
    from attn_explorer.core.layers import SwiGLU
    from attn_explorer.core.llama import Llama, LlamaConfig
    moe = MoEConfig(num_experts=4, top_k=2, hidden=6, norm_topk=True)
    assert isinstance(TransformerBlock(BlockConfig(16, 2, 32, mlp="swiglu", moe=moe)).mlp, MoE)
    cfg = LlamaConfig(vocab_size=32, dim=16, num_layers=3, num_heads=2, num_kv_heads=1, mlp_hidden=24, moe=moe,
                      moe_layers=[True, False, True])
    m = Llama(cfg)
    kinds = [type(b.mlp) for b in m.blocks.layers]
    assert kinds == [MoE, SwiGLU, MoE] and m.blocks.layers[1].mlp.gate.weight.shape == (24, 16)
    assert [cfg.is_moe(i) for i in range(3)] == [True, False, True]
    assert LlamaConfig(**{**cfg.__dict__, "moe": moe.__dict__}).moe == moe  # a stored config's plain dict
    assert all(isinstance(b.mlp, MoE) for b in Llama(LlamaConfig(**{**cfg.__dict__, "moe_layers": None})).blocks.layers)


def test_routing_reaches_the_stack_hooks():
    """blocks.{i}.mlp.hook_expert_indices fires through BlockStack on the MoE layers only."""
    from attn_explorer.core.hooks import Hooks
    from attn_explorer.core.llama import Llama, LlamaConfig
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, dim=16, num_layers=2, num_heads=2, num_kv_heads=1, mlp_hidden=24,
                      moe=MoEConfig(num_experts=4, top_k=2, hidden=6), moe_layers=[False, True])
    m = Llama(cfg)
    seen = {}
    fns = {f"blocks.{i}.mlp.hook_expert_{p}": (lambda x, name: seen.__setitem__(name, x),)
           for i in range(2) for p in ("indices", "weights")}
    with torch.no_grad():
        m(torch.randint(0, 32, (1, 5)), hooks=Hooks(fns))
    assert set(seen) == {"blocks.1.mlp.hook_expert_indices", "blocks.1.mlp.hook_expert_weights"}
    assert seen["blocks.1.mlp.hook_expert_indices"].shape == (1, 5, 2)


def test_deepseek_router_in_float32_in_a_bfloat16_model():
    """DeepSeek-V3 routes in float32 whatever the model's dtype (router_fp32): in bfloat16 the choice and the
    output follow transformers' (its gate casts to float32), where routing in bfloat16 would round the scores."""
    torch.manual_seed(0)
    hf, ref, run_hf = _deepseek()
    ours = MoE(D, MoEConfig(**{**ref.cfg.__dict__, "router_fp32": True}))
    ours.load_state_dict(ref.state_dict())
    hf, ours = hf.to(torch.bfloat16), ours.to(torch.bfloat16)
    x = torch.randn(2, T, D).to(torch.bfloat16)
    with torch.no_grad():
        want, got = run_hf(x), ours(x)
        idx_hf = hf.gate(x.view(-1, D))[2].sort(-1).values
        idx_ours = ours.router(x.view(-1, D))[0].sort(-1).values
    assert torch.equal(idx_hf, idx_ours)
    assert (want.float() - got.float()).abs().max() <= 2e-2 * want.float().abs().max()
    assert ours.router(x.view(-1, D))[1].dtype == torch.float32
