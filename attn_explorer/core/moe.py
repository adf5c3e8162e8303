"""Mixture-of-experts MLPs: a router picks k of E expert MLPs per token, and the token's MLP output is
the weighted sum of those experts' outputs (plus, in some families, a shared expert every token uses).

One module, `MoE(dim, cfg)`, covers the four routers and experts transformers ships, set by MoEConfig:

    Qwen3-MoE    softmax over all E router logits, top-k of the probabilities, renormalised over the k
                 where norm_topk; SwiGLU experts.                 MoEConfig(scoring="softmax", ...)
    gpt-oss      a router with a bias; top-k of the logits, then a softmax over the chosen k; experts with
                 biases and the clamped SwiGLU (up + 1) · g·σ(α g), g ≤ limit, |up| ≤ limit.
                                                                  MoEConfig(scoring="topk_softmax", ...)
    Llama 4      σ(logit) of the top-k (top-1) logits; the weight multiplies the expert's INPUT, not its
                 output (weight_input); a shared SwiGLU expert.    MoEConfig(scoring="sigmoid", ...)
    DeepSeek-V3  σ(logits); choice on σ + e_score_correction_bias (choice_bias: for choosing only, the
                 weights are the plain σ), limited to the topk_group best of n_group expert groups (a
                 group's score: its two best), renormalised (norm_topk), times routed_scaling_factor;
                 shared experts; the router in float32 (router_fp32). MoEConfig(scoring="sigmoid", ...)

The experts are computed one at a time, each on the tokens that chose it (`MoE.forward`), so the sum is
readable; an expert no token chose costs nothing.

State-dict names (for the family readers' rename rules), E = num_experts, D = dim, I = cfg.hidden:

    router.weight        (E, D)       the router's logits x @ W.T
    router.bias          (E,)         where router_bias (gpt-oss)
    router.choice_bias   (E,)         where choice_bias (DeepSeek-V3's e_score_correction_bias)
    stacked=False (per-expert Linear layers, as Qwen3-MoE and DeepSeek-V3 checkpoints store them):
    experts.{e}.gate.weight (I, D), experts.{e}.up.weight (I, D), experts.{e}.down.weight (D, I)
                                      (and .bias of each where expert_bias)
    stacked=True (3-D tensors in x @ W layout, as gpt-oss and Llama 4 store them):
    experts.gate_up      (E, D, 2I)   gate and up: the first I columns gate, the last I up, or, where
                                      interleaved (gpt-oss), gate in the even columns and up in the odd
    experts.gate_up_bias (E, 2I)      where expert_bias (gpt-oss), the same column order
    experts.down         (E, I, D)
    experts.down_bias    (E, D)       where expert_bias
    shared.gate.weight (S, D), shared.up.weight (S, D), shared.down.weight (D, S)
                                      where shared_hidden = S > 0 (Llama 4's shared_expert, DeepSeek's
                                      shared_experts)
    shared_gate.weight   (1, D)       where shared_gate (Qwen3-Next's shared_expert_gate)

Hook points (core.hooks, relative to blocks.{i}.): mlp.hook_expert_indices (B, N, k) int64, each token's
chosen experts (highest choice score first; transformers' DeepSeek-V3 router leaves them unsorted), and mlp.hook_expert_weights (B, N, k), their weights (what
multiplies each expert's output, or its input where weight_input). A hook may replace either; the
experts then run on the replaced choice.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.explain import act_rule, half_grad
from attn_explorer.core.hooks import HookError
from attn_explorer.core.layers import SwiGLU
from attn_explorer.core.linear import Linear

SCORINGS = ("softmax", "topk_softmax", "sigmoid")
EXPERT_ACTS = ("silu", "clamped_swiglu")


@dataclass(frozen=True)
class MoEConfig:
    """What one MoE layer is built from (the same for every MoE layer of a model)."""

    num_experts: int  # E
    top_k: int  # k experts per token (num_experts_per_tok)
    hidden: int  # each expert's width I (moe_intermediate_size; gpt-oss / Llama 4: intermediate_size)
    scoring: str = "softmax"  # "softmax" (Qwen3-MoE), "topk_softmax" (gpt-oss), "sigmoid" (Llama 4, DeepSeek-V3)
    norm_topk: bool = False  # the k weights divided by their sum (norm_topk_prob)
    router_bias: bool = False  # the router has a bias (gpt-oss)
    choice_bias: bool = False  # a per-expert bias added to the scores for choosing only (DeepSeek-V3)
    n_group: int = 1  # experts in n_group groups; only the topk_group best groups are chosen from (DeepSeek-V3)
    topk_group: int = 1
    scaling: float = 1.0  # the weights times this (routed_scaling_factor)
    weight_input: bool = False  # the weight multiplies the expert's input, not its output (Llama 4)
    shared_hidden: int = 0  # the shared expert's width (0: none)
    act: str = "silu"  # "silu": down(silu(gate) * up); "clamped_swiglu": gpt-oss's, with alpha and limit
    alpha: float = 1.702  # clamped_swiglu's σ(alpha · gate)
    limit: float = 7.0  # clamped_swiglu's clamp
    expert_bias: bool = False  # the experts' projections have biases (gpt-oss)
    stacked: bool = False  # experts as 3-D tensors in x @ W layout (gpt-oss, Llama 4); else per-expert Linears
    interleaved: bool = False  # stacked gate_up's columns alternate gate, up (gpt-oss); else gate half, up half
    router_fp32: bool = False  # logits from float32 inputs and weights, weights kept float32 (DeepSeek-V3's router)
    # Qwen3-Next:
    shared_gate: bool = False  # the shared expert's output times sigmoid(shared_gate(x)) (shared_expert_gate, (1, D))

    def __post_init__(self):
        if self.scoring not in SCORINGS:
            raise ValueError(f"unknown MoE scoring {self.scoring!r}: use one of {', '.join(SCORINGS)}")
        if self.act not in EXPERT_ACTS:
            raise ValueError(f"unknown expert activation {self.act!r}: use one of {', '.join(EXPERT_ACTS)}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k must be between 1 and num_experts ({self.num_experts}), got {self.top_k}")
        if self.n_group < 1 or self.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"n_group must divide num_experts ({self.num_experts}) and 1 <= topk_group <= n_group, "
                             f"got n_group {self.n_group}, topk_group {self.topk_group}")
        if self.n_group > 1 and self.num_experts // self.n_group < 2:
            raise ValueError("group-limited routing scores each group by its two best experts: "
                             f"{self.num_experts} experts in {self.n_group} groups leave fewer than 2 per group")
        if self.interleaved and not self.stacked:
            raise ValueError("interleaved gate/up columns need stacked experts")


class Router(nn.Module):
    """x (T, D) -> (indices (T, k), weights (T, k)): each token's chosen experts and their weights."""

    def __init__(self, dim: int, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, dim))
        self.bias = nn.Parameter(torch.zeros(cfg.num_experts)) if cfg.router_bias else None
        if cfg.choice_bias:
            self.register_buffer("choice_bias", torch.zeros(cfg.num_experts))
        else:
            self.choice_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cfg
        if c.router_fp32:  # DeepSeek-V3: the whole router in float32, whatever the model's dtype
            logits = F.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())
        else:
            logits = F.linear(x, self.weight, self.bias)  # (T, E)
        if c.scoring == "topk_softmax":  # gpt-oss: the best k logits, then a softmax over them alone
            top, indices = logits.topk(c.top_k, dim=-1)
            return indices, torch.softmax(top, dim=-1)
        if c.scoring == "softmax":
            scores = torch.softmax(logits.float(), dim=-1)
        else:
            scores = torch.sigmoid(logits.float())
        choice = scores if self.choice_bias is None else scores + self.choice_bias.float()
        if c.n_group > 1:  # only the topk_group groups with the highest sum of their two best scores
            groups = choice.view(-1, c.n_group, c.num_experts // c.n_group)
            best = groups.topk(2, dim=-1).values.sum(-1)  # (T, n_group)
            keep = torch.zeros_like(best, dtype=torch.bool).scatter_(1, best.topk(c.topk_group, dim=-1).indices, True)
            choice = choice.masked_fill(~keep.repeat_interleave(c.num_experts // c.n_group, dim=1), float("-inf"))
        indices = choice.topk(c.top_k, dim=-1).indices
        weights = scores.gather(1, indices)  # the plain scores: the choice bias only chooses
        if c.norm_topk:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        if c.scaling != 1.0:
            weights = weights * c.scaling
        return indices, weights if c.router_fp32 else weights.to(x.dtype)


class Expert(nn.Module):
    """One expert as Linear layers: gate, up and down (Qwen3-MoE, DeepSeek-V3)."""

    def __init__(self, dim: int, hidden: int, bias: bool):
        super().__init__()
        self.gate = Linear(dim, hidden, bias=bias)
        self.up = Linear(dim, hidden, bias=bias)
        self.down = Linear(hidden, dim, bias=bias)


class StackedExperts(nn.Module):
    """Every expert's weights in three (or, with biases, five) 3-D tensors, x @ W layout (gpt-oss, Llama 4)."""

    def __init__(self, dim: int, cfg: MoEConfig):
        super().__init__()
        E, hidden = cfg.num_experts, cfg.hidden
        self.gate_up = nn.Parameter(torch.zeros(E, dim, 2 * hidden))
        self.down = nn.Parameter(torch.zeros(E, hidden, dim))
        self.gate_up_bias = nn.Parameter(torch.zeros(E, 2 * hidden)) if cfg.expert_bias else None
        self.down_bias = nn.Parameter(torch.zeros(E, dim)) if cfg.expert_bias else None


class MoE(nn.Module):
    """The MoE MLP: route each token to k experts, run each expert on its tokens, sum the weighted outputs
    (and add the shared expert's). See the module docstring for the four families and the state-dict names."""

    def __init__(self, dim: int, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.router = Router(dim, cfg)
        if cfg.stacked:
            self.experts = StackedExperts(dim, cfg)
        else:
            self.experts = nn.ModuleList(Expert(dim, cfg.hidden, cfg.expert_bias) for _ in range(cfg.num_experts))
        self.shared = SwiGLU(dim, cfg.shared_hidden) if cfg.shared_hidden else None
        self.shared_gate = nn.Linear(dim, 1, bias=False) if cfg.shared_gate else None  # Qwen3-Next (F.linear)

    def forward(self, x: torch.Tensor, hooks=None) -> torch.Tensor:
        """x (..., D) -> (..., D). hooks (core.hooks.LayerHooks or None): its mlp.hook_expert_indices and
        mlp.hook_expert_weights see (and may replace) the routing, shaped (*x.shape[:-1], k)."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        indices, weights = self.router(flat)
        if hooks is not None:
            k = self.cfg.top_k
            indices = hooks("mlp.hook_expert_indices", indices.view(*shape[:-1], k)).reshape(-1, k)
            weights = hooks("mlp.hook_expert_weights", weights.view(*shape[:-1], k)).reshape(-1, k)
            bad = indices[(indices < 0) | (indices >= self.cfg.num_experts)]
            if bad.numel():
                raise HookError(f"the hook on mlp.hook_expert_indices chose expert {int(bad[0])}; this layer has "
                                f"experts 0..{self.cfg.num_experts - 1}")
        out = torch.zeros_like(flat)
        for e in indices.unique().tolist():  # only the experts some token chose
            token, slot = torch.where(indices == e)
            w = weights[token, slot, None]
            h = flat[token]
            # explain's uniform rule on the product of two token-dependent factors (no-ops otherwise)
            if self.cfg.weight_input:  # Llama 4: the weight scales what the expert reads
                y = self.expert(e, half_grad(h) * half_grad(w))
            else:
                y = half_grad(self.expert(e, h)) * half_grad(w)
            out = out.index_add(0, token, y.to(out.dtype))
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:  # Qwen3-Next: a sigmoid gate per token on the shared expert
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            out = out + shared
        return out.view(shape)

    def expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        """Expert e on the rows h (T_e, D) -> (T_e, D)."""
        c = self.cfg
        if c.stacked:
            s = self.experts
            gate_up = h @ s.gate_up[e]
            if s.gate_up_bias is not None:
                gate_up = gate_up + s.gate_up_bias[e]
            gate, up = (gate_up[..., ::2], gate_up[..., 1::2]) if c.interleaved else gate_up.chunk(2, dim=-1)
        else:
            ex = self.experts[e]
            gate, up = ex.gate(h), ex.up(h)
        if c.act == "clamped_swiglu":  # gpt-oss: gate clamped above, up both ways, (up + 1) · gate·σ(α·gate)
            gate = gate.clamp(max=c.limit)
            up = up.clamp(min=-c.limit, max=c.limit)
            a = (up + 1) * (gate * torch.sigmoid(gate * c.alpha))
        else:
            a = half_grad(act_rule(F.silu, gate)) * half_grad(up)  # explain's rules: no-ops otherwise
        if c.stacked:
            y = a @ self.experts.down[e]
            return y if self.experts.down_bias is None else y + self.experts.down_bias[e]
        return self.experts[e].down(a)
