"""Gated DeltaNet (Qwen3.5, Qwen3-Next), written out: the layer, its delta rule (plain and chunked), its implicit map.

Per token t, from the block's normalised input x_t:
    [q, k, v] = silu(causal_conv1d(in_proj_qkv x))      (a depthwise convolution over the last `conv_kernel` tokens)
    q_t, k_t  = l2norm(q_t), l2norm(k_t) per key head;   q_t /= sqrt(d_k)
    β_t       = sigmoid(in_proj_b x_t)                    per value head: how strongly the token writes
    g_t       = -exp(A_log) · softplus(in_proj_a x_t + dt_bias)   per value head, <= 0: the state decays by exp(g_t)
    S_t       = exp(g_t) S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ;   o_t = S_t q_t        (S: d_v × d_k)
    out       = out_proj(RMSNorm(o_t) · silu(z_t)),  z = in_proj_z x                  (the gated RMSNorm per head)
Key heads are fewer than value heads: value head h reads key head h // (H_v / H_k) (consecutive heads share one).
Qwen3-Next stores the projections fused per key head (in_proj_qkvz, in_proj_ba; layout "next"); Qwen3.5 apart.

The implicit map A (B, H_v, N, N) with o_t = Σ_s A[t, s] v_s is the delta rule run on one-hot values (derived in
core.recurrent's docstring): `implicit_map`. `delta_rule` is the plain recurrence, `chunked_delta_rule` the same
numbers in chunks of 64 (the UT transform inside each chunk, the state carried between chunks). A lazy run's views
compute any band of the map, or pool it, from q, k, g and β alone (core.delta_map; KeptDeltaNet).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from torch.nn import Linear  # torch's F.linear: transformers' rounding (the decay is exp'd over many tokens)
from attn_explorer.core.cell_pool import CellPool
from attn_explorer.core.delta_map import BLOCK, TILE, map_bands, pool_map
from attn_explorer.core.recurrent import RecurrentMixer, RecurrentState


def delta_rule(q, k, v, g, beta, state=None):
    """The plain recurrence, token by token. q, k (B, H, N, d_k) (normalised, q scaled), v (B, H, N, d_v), g and
    beta (B, H, N), state (B, H, d_k, d_v) or None (zeros; stored as Sᵀ, transformers' layout). Float32 in and
    out; returns (o (B, H, N, d_v), the last state)."""
    B, H, N, dk = k.shape
    S = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state
    out = []
    for t in range(N):
        S = S * g[:, :, t].exp()[..., None, None]
        kt = k[:, :, t]
        delta = (v[:, :, t] - (S * kt[..., None]).sum(-2)) * beta[:, :, t, None]  # β (v - Sk): what is written
        S = S + kt[..., None] * delta[..., None, :]
        out.append((S * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, dim=2), S


def chunked_delta_rule(q, k, v, g, beta, state=None, chunk: int = 64):
    """delta_rule's numbers in chunks (as transformers' torch_chunk_gated_delta_rule orders them). Inside a chunk,
    with G_i the cumulative log decay from its start, the writes u = (β v - β decayed-K · S) solve one unit lower
    triangular system T u = β v - ..., T = I + tril_{-1}(β_i k_i·k_j e^{G_i - G_j}) (the UT / WY transform); the
    chunk's outputs are e^{G_i} q_i·S + Σ_{j<=i} e^{G_i - G_j} q_i·k_j u_j, and S moves on by the chunk's decay."""
    B, H, N, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk - N % chunk) % chunk
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (N + pad) // chunk
    q, k, v = (t.reshape(B, H, n, chunk, t.shape[-1]) for t in (q, k, v))
    g, beta = g.reshape(B, H, n, chunk), beta.reshape(B, H, n, chunk)
    G = g.cumsum(-1)  # (B, H, n, C)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(upper, float("-inf")).exp()  # e^{G_i - G_j}, j <= i
    kb, vb = k * beta[..., None], v * beta[..., None]
    T = (kb @ k.transpose(-1, -2)) * decay  # its diagonal is β_i |k_i|², the rest the strict lower part
    u = torch.linalg.solve_triangular(T, vb, upper=False, unitriangular=True)  # the writes, before the state's part
    w = torch.linalg.solve_triangular(T, kb * G.exp()[..., None], upper=False, unitriangular=True)
    inner = (q @ k.transpose(-1, -2)) * decay
    qd = q * G.exp()[..., None]
    kd = k * (G[..., -1:] - G).exp()[..., None]
    S = q.new_zeros(B, H, dk, dv) if state is None else state
    out = torch.empty_like(v)
    for c in range(n):
        write = u[:, :, c] - w[:, :, c] @ S
        out[:, :, c] = qd[:, :, c] @ S + inner[:, :, c] @ write
        S = S * G[:, :, c, -1].exp()[..., None, None] + kd[:, :, c].transpose(-1, -2) @ write
    return out.reshape(B, H, n * chunk, dv)[:, :, :N], S


def implicit_map(q, k, g, beta, chunk: int = 64) -> torch.Tensor:
    """A (B, H, N, N) with o_t = Σ_s A[t, s] v_s: the delta rule on one-hot values (core.recurrent derives it).
    Upper triangle exactly 0. Computed in float64 and returned in q's dtype."""
    B, H, N, _ = q.shape
    eye = torch.eye(N, dtype=torch.float64, device=q.device).expand(B, H, N, N)
    a, _ = chunked_delta_rule(*(t.double() for t in (q, k)), eye, g.double(), beta.double(), chunk=chunk)
    return a.tril().to(q.dtype)


def map_tile(q, k, g, beta, rows: slice, cols: slice) -> torch.Tensor:
    """A[..., rows, cols] from the per-token quantities alone, exactly: the recurrence from token cols.start to
    rows.stop - 1 on the one-hots of cols' tokens. (B, H, len(rows), len(cols)); O(n) memory."""
    s0, s1, t0, t1 = cols.start, cols.stop, rows.start, rows.stop
    B, H = q.shape[:2]
    out = q.new_zeros(B, H, t1 - t0, s1 - s0, dtype=torch.float64)
    if t1 <= s0:
        return out.to(q.dtype)
    span = slice(s0, t1)
    onehot = torch.eye(t1 - s0, s1 - s0, dtype=torch.float64, device=q.device)
    a, _ = chunked_delta_rule(*(t[:, :, span].double() for t in (q, k)), onehot.expand(B, H, -1, -1),
                              g[:, :, span].double(), beta[:, :, span].double())
    lo = max(t0, s0)
    out[:, :, lo - t0:] = a[:, :, lo - s0:]
    return out.to(q.dtype)


class KeptDeltaNet:
    """What a lazy run keeps of one Gated DeltaNet layer instead of its maps (core.hooks.Hooks.kept[layer]): q and k
    per key head (B, H_k, n, d_k) (normed, q scaled), the decay g and β per value head (B, H_v, n), float32: O(n)
    numbers, from which `tile` and `pooled` compute any part of any value head's map exactly (batch row 0, map_bands).
    The maps are signed: a pooled cell's "max" is its entry of largest magnitude, sign kept."""

    kind = "deltanet"

    def __init__(self, q: torch.Tensor, k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, first: int = 0):
        self.q, self.k, self.g, self.beta = q, k, g, beta
        self.first = first  # this pass began at token `first` (prefix reuse; q, k, g, β are every token's: the cache's)

    def splice(self, old: "KeptDeltaNet", p: int) -> "KeptDeltaNet":
        """Prefix reuse: this pass already holds every token's quantities (the recurrent cache keeps them)."""
        if self.first != p:
            raise ValueError(f"this pass began at token {self.first}, not {p}")
        return KeptDeltaNet(self.q, self.k, self.g, self.beta)

    @property
    def heads(self) -> int:
        return int(self.g.shape[1])

    @property
    def n(self) -> int:
        return int(self.g.shape[-1])

    m = n  # keys: the same tokens

    @property
    def device(self) -> torch.device:
        return self.q.device

    def tensors(self) -> list[torch.Tensor]:
        return [self.q, self.k, self.g, self.beta]

    def _head(self, head: int):
        kh = head // (self.heads // self.q.shape[1])  # value head h reads key head h // (H_v / H_k)
        one, key = slice(head, head + 1), slice(kh, kh + 1)
        return self.q[:1, key], self.k[:1, key], self.g[:1, one], self.beta[:1, one]

    def bands(self, head: int, rows: slice, cols: slice, block: int = 1 << 20):
        """Head `head`'s (t0, t1, A[t0:t1, cols]) float64 bands over rows (map_bands)."""
        for a, b, band in map_bands(*self._head(head), rows, cols, block):
            yield a, b, band[0, 0]

    def tile(self, head: int, rows: slice, cols: slice) -> torch.Tensor:
        """Head `head`'s A[rows, cols] (len(rows), len(cols)), float32."""
        out = torch.zeros(rows.stop - rows.start, cols.stop - cols.start, dtype=torch.float32, device=self.device)
        for a, b, band in self.bands(head, rows, cols):
            out[a - rows.start:b - rows.start] = band
        return out

    def pooled(self, head: int, row_edges, col_edges, reduce: str, rows: slice, cols: slice, check=None,
               block: int = BLOCK * TILE) -> torch.Tensor:
        """(len(row_edges) - 1, len(col_edges) - 1) cells over A[rows, cols], each the mean or the signed entry of
        largest magnitude ("max") of its block; one pass of bands over the rows (core.delta_map.pool_map: tiles of
        about `block` entries, only the columns each band can reach), pooled as they come (core.cell_pool)."""
        pool = CellPool(row_edges, col_edges, reduce, rows, cols, self.device)
        q, k, g, beta = (t[0, 0] for t in self._head(head))
        pool_map(q, k, g, beta, pool, rows, cols, tile=max(64, block // BLOCK), check=check)
        return pool.result()


@dataclass(frozen=True)
class DeltaNetConfig:
    """A Gated DeltaNet layer's sizes (linear_* in config.json); BlockConfig.mixer builds it."""

    num_k_heads: int  # linear_num_key_heads
    num_v_heads: int  # linear_num_value_heads: the map's H_layer
    head_k_dim: int  # linear_key_head_dim
    head_v_dim: int  # linear_value_head_dim
    conv_kernel: int = 4  # linear_conv_kernel_dim
    eps: float = 1e-6  # rms_norm_eps (the gated norm's)
    layout: str = "split"  # "split": in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (Qwen3.5); "next": fused per
    #                        key head, in_proj_qkvz and in_proj_ba (Qwen3-Next)
    chunk: int = 64  # the chunked form's chunk
    family: str = "qwen3_5_text"  # named in refusals

    def build(self, dim: int) -> "GatedDeltaNet":
        return GatedDeltaNet(dim, self)

    def map_heads(self) -> int:
        """The heads of this layer's maps (one per value head)."""
        return self.num_v_heads


class GatedRMSNorm(nn.Module):
    """RMSNorm(x) · w · silu(gate) over each head's d_v, in float32 (Qwen3.5's RMSNormGated; its weight plain)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight * y.to(dtype)
        return (y * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(RecurrentMixer):
    """The layer (see the module docstring); its parameters carry transformers' names (linear_attn.*)."""

    kind = "deltanet"

    def __init__(self, dim: int, c: DeltaNetConfig):
        super().__init__()
        if c.num_v_heads % c.num_k_heads:
            raise ValueError(f"linear_num_value_heads={c.num_v_heads} is not a multiple of "
                             f"linear_num_key_heads={c.num_k_heads}")
        self.c = c
        self.num_heads, self.head_dim = c.num_v_heads, c.head_v_dim  # the heads of hook_z and of the maps
        self.key_dim, self.value_dim = c.num_k_heads * c.head_k_dim, c.num_v_heads * c.head_v_dim
        conv_dim = 2 * self.key_dim + self.value_dim
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, c.conv_kernel, groups=conv_dim, bias=False)
        if c.layout == "next":
            self.in_proj_qkvz = Linear(dim, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(dim, 2 * c.num_v_heads, bias=False)
        elif c.layout == "split":
            self.in_proj_qkv = Linear(dim, conv_dim, bias=False)
            self.in_proj_z = Linear(dim, self.value_dim, bias=False)
            # β and the decay as transformers rounds them (torch's F.linear, not the packed fast path): the decay
            # is exp'd and multiplied over many tokens, where one rounding step shows
            self.in_proj_b = nn.Linear(dim, c.num_v_heads, bias=False)
            self.in_proj_a = nn.Linear(dim, c.num_v_heads, bias=False)
        else:
            raise ValueError(f"unknown DeltaNet layout {c.layout!r}: use 'split' or 'next'")
        self.dt_bias = nn.Parameter(torch.ones(c.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(c.num_v_heads))
        self.norm = GatedRMSNorm(c.head_v_dim, c.eps)
        self.out_proj = Linear(self.value_dim, dim, bias=False)

    def kept_bytes(self, n: int) -> int:
        """What a lazy run of n tokens keeps of this layer (KeptDeltaNet: q, k per key head, g, β; float32)."""
        return 4 * n * (2 * self.c.num_k_heads * self.c.head_k_dim + 2 * self.c.num_v_heads)

    @property
    def out(self) -> nn.Linear:
        """out_proj under the name a softmax layer's W_O has (the analyses split it by head: hook_z is its input)."""
        return self.out_proj

    def _project(self, x: torch.Tensor):
        """(qkv (B, N, conv_dim) in [q | k | v] order, z (B, N, H_v, d_v), b, a (B, N, H_v))."""
        c, (B, N, _) = self.c, x.shape
        if c.layout == "split":
            z = self.in_proj_z(x).view(B, N, c.num_v_heads, c.head_v_dim)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        r = c.num_v_heads // c.num_k_heads  # per key head: [q_h, k_h, r value heads, r z heads]; [r b's, r a's]
        parts = self.in_proj_qkvz(x).view(B, N, c.num_k_heads, -1)
        q, k, v, z = parts.split([c.head_k_dim, c.head_k_dim, r * c.head_v_dim, r * c.head_v_dim], dim=-1)
        b, a = self.in_proj_ba(x).view(B, N, c.num_k_heads, 2 * r).split([r, r], dim=-1)
        qkv = torch.cat([t.reshape(B, N, -1) for t in (q, k, v)], dim=-1)
        return qkv, z.reshape(B, N, c.num_v_heads, c.head_v_dim), b.reshape(B, N, -1), a.reshape(B, N, -1)

    def _conv(self, qkv: torch.Tensor, cache: RecurrentState | None):
        """silu(depthwise causal conv) over (B, C, N), the cached last K - 1 inputs in front; (out, new conv state)."""
        K = self.c.conv_kernel
        B, C, N = qkv.shape
        if cache is None or cache.conv is None:  # zeros before the first token (torch's own padding: its numbers)
            out = F.silu(F.conv1d(qkv, self.conv1d.weight, padding=K - 1, groups=C)[..., :N])
            full = F.pad(qkv, (max(0, K - 1 - N), 0))
        else:
            full = torch.cat([cache.conv.to(qkv.dtype), qkv], dim=-1)
            out = F.silu(F.conv1d(full, self.conv1d.weight, groups=C))
        return out, full[..., full.shape[-1] - (K - 1):]

    def per_token(self, x: torch.Tensor, cache: RecurrentState | None = None, real: torch.Tensor | None = None):
        """q, k (B, H_v, N, d_k) (l2-normed, q / sqrt(d_k), key heads repeated to value heads), v (B, H_v, N, d_v),
        g, beta (B, H_v, N) in float32, z (B, N, H_v, d_v) and the new conv state."""
        c, (B, N, _) = self.c, x.shape
        if real is not None:  # padding tokens read as zeros (transformers' apply_mask_to_padding_states)
            x = (x * real[:, :, None]).to(x.dtype)
        qkv, z, b, a = self._project(x)
        mixed, conv = self._conv(qkv.transpose(1, 2), cache)
        q, k, v = mixed.transpose(1, 2).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = (t.reshape(B, N, c.num_k_heads, c.head_k_dim) for t in (q, k))
        v = v.reshape(B, N, c.num_v_heads, c.head_v_dim)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        r = c.num_v_heads // c.num_k_heads
        if r > 1:  # key heads repeated to the value heads first, in transformers' order (the same rounding)
            q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
        q, k, v, beta, g = (t.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                            for t in (q, k, v, beta, g))
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q * c.head_k_dim ** -0.5
        return q, k, v, g, beta, z, conv

    def forward(self, x: torch.Tensor, opts=None):
        """(B, N, D) -> (out (B, N, D), implicit maps (B, H_v, N, M) where asked, else None). See core.recurrent
        for the hooks, the cache (opts.kv, a RecurrentState) and the maps."""
        B, N, _ = x.shape
        cache = getattr(opts, "kv", None)
        if cache is not None and not isinstance(cache, RecurrentState):
            raise ValueError("a Gated DeltaNet layer's cache slot holds a RecurrentState (the model's new_cache())")
        lh = getattr(opts, "hooks", None)
        q, k, v, g, beta, z, conv = self.per_token(x, cache, self.real_tokens(opts, N))
        r = self.c.num_v_heads // self.c.num_k_heads
        if lh is not None:  # q and k per key head at the hooks (before the repetition), as a softmax layer's keys
            q = lh("attn.hook_q", q[:, ::r]).repeat_interleave(r, dim=1) if lh.wants("attn.hook_q") else q
            k = lh("attn.hook_k", k[:, ::r]).repeat_interleave(r, dim=1) if lh.wants("attn.hook_k") else k
            v = lh("attn.hook_v", v)
            beta = lh("attn.hook_beta", beta.transpose(1, 2)).transpose(1, 2)
            g = lh("attn.hook_decay", g.transpose(1, 2)).transpose(1, 2)
        want_maps = bool(getattr(opts, "need_weights", False)) or (lh is not None and lh.wants("attn.hook_pattern"))
        state = None if cache is None else cache.state
        past = cache.kept if cache is not None and cache.length else ()
        if cache is not None:  # every token's q, k, g, β: the rows of a later step's map are exact
            cache.kept = tuple(torch.cat([a, b], dim=2) for a, b in zip(past, (q, k, g, beta))) if past else \
                (q, k, g, beta)
        if lh is not None and lh.keep:  # a lazy run: keep q, k (per key head), g and β, from which any tile is exact
            if lh.wants("attn.hook_pattern"):
                raise ValueError(f"{self.c.family}: a lazy run keeps no map for a hook on attn.hook_pattern to "
                                 "replace; pass lazy=False")
            every = cache.kept if cache is not None else (q, k, g, beta)  # after a kept prefix: every token's
            lh.hooks.kept[lh.index] = KeptDeltaNet(every[0][:, ::r].contiguous(), every[1][:, ::r].contiguous(),
                                                   every[2], every[3], first=every[2].shape[-1] - N)
        maps, replaced = None, False
        if want_maps:  # with a cache: the map over every token so far, the new tokens' rows
            maps = implicit_map(*(cache.kept if past else (q, k, g, beta)), self.c.chunk)[:, :, -N:]
        if maps is not None and lh is not None and lh.wants("attn.hook_pattern"):
            new = lh("attn.hook_pattern", maps)
            replaced, maps = new is not maps, new
            if replaced and past:
                raise ValueError(f"{self.c.family}: a replaced implicit map after a recurrent cache has no earlier "
                                 "values to weigh; run the whole text")
        # a replaced map weighs the values (the output is A' @ V); under autograd (gradient relevance) the output
        # goes through A @ V too, so the maps are in the graph; otherwise the recurrence (the same numbers)
        through_map = maps is not None and not past and (replaced or maps.requires_grad)
        S = None
        if through_map:
            o = maps.float() @ v
        if not through_map or cache is not None:
            if N == 1 and state is not None:
                o_rec, S = delta_rule(q, k, v, g, beta, state)
            else:
                o_rec, S = chunked_delta_rule(q, k, v, g, beta, state, self.c.chunk)
            o = o if through_map else o_rec
        if cache is not None:
            cache.advance(conv, S, N)
        o = o.to(x.dtype).transpose(1, 2)  # (B, N, H_v, d_v)
        y = self.norm(o, z).transpose(1, 2)  # (B, H_v, N, d_v): each head's input to out_proj
        if lh is not None:
            y = lh("attn.hook_z", y)
        out = self.out_proj(y.transpose(1, 2).reshape(B, N, self.value_dim))
        if maps is not None and getattr(opts, "need_weights", False):
            return out, self.hand_out(maps.to(x.dtype), opts)
        return out, None
