"""Recurrent mixers in the block stack, and the implicit attention they hold (the hybrids' shared interface).

A hybrid model (Qwen3.5 / Qwen3-Next: Gated DeltaNet; Granite 4 hybrid / Falcon-H1: Mamba-2) puts a recurrent
*mixer* where a softmax layer has its attention. Such a mixer sits in our stack exactly like
core.attention.MultiHeadAttention does, so TransformerBlock and BlockStack treat both alike:

- it is the block's `attn`, built by BlockConfig.mixer (any object with `build(dim) -> RecurrentMixer`;
  core.deltanet.DeltaNetConfig, the Mamba-2 one alike), and has `num_heads` (its map's H_layer, which may differ
  from the softmax layers' H) and `kind` ("deltanet", "mamba2": a key of MIXER_WORDS);
- forward(x (B, N, D), opts: AttentionOptions) -> (output (B, N, D), maps (B, H_layer, N, M) or None). The maps
  are made only where opts.need_weights (written into opts.probs_out when given) or attn.hook_pattern is hooked;
  they are signed implicit maps A (rows need not sum to 1: never probabilities);
- its per-token cache is a RecurrentState in the KVCache's slot for its layer (cache.layers[i]; a hybrid's
  new_cache() puts one there): opts.kv is then the RecurrentState, and `length` counts the tokens it has read;
- hooks (core.hooks.MIXER_POINTS add the mixer's own points): attn.hook_q / hook_k / hook_v are its per-token
  query-like, key-like and value-like vectors (head-major, (B, N, heads, d) at the hook), attn.hook_pattern is
  the implicit map A (B, H_layer, N, M): a hook that reads it gets A, one that returns a new A makes the
  output A' @ V (exact: A @ V is the mixer's output); attn.hook_z is every head's input to the output
  projection, (B, N, H_layer, d) at the hook (after the output gate and norm), so api.hooks.head_hook ablates and
  patches a recurrent head as it does a softmax one.

RunResult.attentions (L, H, N, N) with layers of different head counts: H is the largest H_layer; a layer with
fewer heads fills heads H_layer..H-1 with zeros (not NaN: every saved run, export and view refuses NaN maps as an
overflow), and those heads do not exist for anything else: ModelInfo.layer_heads says per layer how many are real
(ablation and the head pickers check it), ModelInfo.mixers per layer which kind ("softmax", "deltanet", "mamba2"),
and ModelInfo.layer_kinds the words for people ("gated DeltaNet (implicit)").
A lazy run keeps a recurrent layer's per-token quantities (core.mamba2.KeptMamba, core.deltanet.KeptDeltaNet).

The implicit map, derived (Gated DeltaNet; core.deltanet; per value head, q_t already L2-normed and scaled):
    S_t = g_t · S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ,    o_t = S_t q_t          (S: d_v × d_k, S_0 = 0)
S_t is linear in the values: unrolling, S_t = Σ_{s<=t} β_s v_s k_sᵀ P(s, t) with P(s, t) = Π_{r=s+1..t} g_r (I -
β_r k_r k_rᵀ) (the factors in increasing r, P(t, t) = I). Hence o_t = Σ_s A[t, s] v_s with
    A[t, s] = β_s · k_sᵀ P(s, t) q_t   for s <= t, 0 above the diagonal.
Since every factor of P is symmetric, A[t, :] = q_tᵀ U_t with U_t = P(·, t)ᵀ-weighted keys: the columns of U_t
(d_k × t) obey U_t = g_t (I - β_t k_t k_tᵀ) [U_{t-1}, 0] + β_t k_t e_tᵀ, which is the same recurrence with the
values replaced by the one-hot e_s. So A is the delta rule itself run on V = I_N: the chunked (WY / UT) form that
computes the layer computes its map too, chunk by chunk and chained across chunks through the state, exactly.
A tile A[t0:t1, s0:s1] needs only the recurrence from s0 to t1 on the one-hots of s0..s1-1: O(n) kept quantities
(q, k, β, g) give any part of the map. Mamba-2's map is L ∘ (C Bᵀ) per head (see its module).
"""
from __future__ import annotations

import torch
from torch import nn

# ModelInfo.mixers' machine-readable kinds -> the words ModelInfo.layer_kinds shows per layer
MIXER_WORDS = {
    "softmax": "softmax",
    "deltanet": "gated DeltaNet (implicit)",
    "mamba2": "Mamba-2 (implicit)",
}


class RecurrentState:
    """One recurrent layer's cache between generation steps (in KVCache.layers[i]): the short convolution's last
    inputs `conv` (B, C, K - 1) and the recurrent state `state` (DeltaNet: (B, H, d_k, d_v); Mamba-2: its own),
    and the tokens read so far (`length`, as LayerKV.length)."""

    def __init__(self):
        self.conv: torch.Tensor | None = None
        self.state: torch.Tensor | None = None
        self.length = 0
        # per-token quantities a mixer keeps (O(n), like a KV cache) so a step's map rows stay exact (DeltaNet:
        # q, k, g, β, each (B, H, n, ...)); empty where it keeps none
        self.kept: tuple = ()

    def advance(self, conv: torch.Tensor | None, state: torch.Tensor | None, n: int) -> None:
        self.conv, self.state, self.length = conv, state, self.length + n

    def truncate(self, n: int) -> None:
        """Prefix reuse: a recurrent state cannot forget tokens, so only keeping all of them is possible."""
        if n != self.length:
            raise ValueError(f"a recurrent layer's state holds all {self.length} tokens read and cannot go back to "
                             f"the first {n} (prefix reuse is not possible on a hybrid model)")


class RecurrentMixer(nn.Module):
    """The base of a recurrent mixer (see the module's docstring for the contract). Subclasses set num_heads and
    kind and implement forward; the helpers below do what every mixer does the same way."""

    kind = "recurrent"
    num_heads: int

    @staticmethod
    def real_tokens(opts, n: int) -> torch.Tensor | None:
        """(B, n) bool, True for the new tokens that are real (not padding), from opts.mask (key_padding_mask's
        bool (B, 1, 1, M)); None where there is no padding mask."""
        m = getattr(opts, "mask", None)
        if m is None:
            return None
        if m.dtype != torch.bool or m.dim() != 4 or m.shape[1] != 1 or m.shape[2] != 1:
            raise ValueError("a recurrent layer takes only a key padding mask (B, 1, 1, M), not a full mask")
        return m[:, 0, 0, -n:]

    @staticmethod
    def hand_out(maps: torch.Tensor, opts) -> torch.Tensor:
        """The maps returned by forward: copied into opts.probs_out (the stack's buffer) where it is given."""
        out = getattr(opts, "probs_out", None)
        if out is not None and not maps.requires_grad:
            return out.copy_(maps)
        return maps
