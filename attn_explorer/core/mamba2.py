"""The Mamba-2 mixer (state-space duality), as Granite 4 (granitemoehybrid) and Falcon-H1 use it, and its
implicit attention map.

One layer, x (B, N, D) -> (B, N, D):

    z, xBC, dt = in_proj(x)                      gate (I), conv input (I + 2·G·S), one step size per head (H)
    xBC = act(causal_conv1d(xBC))                depthwise, kernel K, left-padded (the conv state in generation)
    x, B, C = split(xBC)                         x: H heads of P = I / H; B, C: G groups of S (head h reads
                                                 group h // (H / G))
    dt = softplus(dt + dt_bias), clamped to dt_limit;   a = dt · A_h with A_h = -exp(A_log_h) < 0
    h_t = exp(a_t) h_{t-1} + dt_t · x_t B_tᵀ     the state (P × S per head); y_t = h_t C_t
    y_t += D_h · x_t                             the skip term
    y = norm(y, z)                               the gated RMSNorm (per group of I / G channels):
                                                 "gate_first" (Granite): rms(y · silu(z)) · w;
                                                 "norm_first" (Falcon-H1 norm_before_gate): rms(y) · w · silu(z);
                                                 "gate_only" (Falcon-H1 without mamba_rms_norm): y · silu(z)
    out = out_proj(y)

The implicit map. Unroll the recurrence from h_0 = 0 (or fold the cached state in as "before the input"):

    h_t = Σ_{s≤t} (Π_{r=s+1..t} exp(a_r)) · dt_s · x_s B_sᵀ = Σ_{s≤t} exp(Σ_{r=s+1..t} a_r) · dt_s · x_s B_sᵀ
    y_t = h_t C_t = Σ_{s≤t} [ (C_t · B_s) · exp(Σ_{r=s+1..t} a_r) · dt_s ] · x_s

so, per head, y_t (before the D skip, the gate and the norm) = Σ_s A[t, s] x_s with

    A[t, s] = (C_t · B_s) · exp(cum_t - cum_s) · dt_s  for s ≤ t (0 above the diagonal),  cum_t = Σ_{r≤t} a_r,

that is A = L ∘ (C Bᵀ) · diag(dt): L[t, s] = exp(segment sum of a over (s, t]), the cumulative-decay mask, and
dt_s multiplies the source column (transformers discretises x_s · dt_s, mamba2_chunk_scan). The weights are signed
(C · B may be negative) and rows need not sum to 1. D·x_t is kept apart (`Mamba2Mixer.skip`), not in A.
With a cached state h_0 (generation, prefix reuse) y_t also has exp(cum_t) · h_0 C_t, which no key of the new
tokens carries: the map covers the new tokens' own contributions, and the test checks it from a fresh state.

Three forms of the same sum: `scan_recurrent` (the loop above, for reading), `scan_chunked` (SSD: the map within
each chunk of Q tokens, the states between chunks; for speed) and `implicit_map` (the n × n matrix);
`implicit_tile` computes any block of it from the per-token quantities a lazy run keeps (B, C, dt, A).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_explorer.core.cell_pool import CellPool
from attn_explorer.core.layers import activation
from attn_explorer.core.linear import Linear
from attn_explorer.core.recurrent import RecurrentMixer, RecurrentState

NORMS = ("gate_first", "norm_first", "gate_only")


@dataclass(frozen=True)
class Mamba2Config:
    """What one Mamba-2 mixer is built from (transformers' names in the comments)."""

    dim: int  # D (hidden_size)
    num_heads: int  # H (mamba_n_heads)
    head_dim: int  # P (mamba_d_head); the inner width I = H · P
    state_size: int  # S (mamba_d_state)
    n_groups: int = 1  # G (mamba_n_groups): B and C per group of H / G heads
    conv_kernel: int = 4  # K (mamba_d_conv)
    chunk_size: int = 256  # Q (mamba_chunk_size): the chunked scan's chunk
    conv_bias: bool = True  # mamba_conv_bias
    proj_bias: bool = False  # in_proj's bias (mamba_proj_bias)
    out_bias: bool = False  # out_proj's bias (mamba_proj_bias; Falcon-H1: projectors_bias)
    act: str = "silu"  # the conv's activation (hidden_act)
    eps: float = 1e-6  # the gated norm's epsilon (rms_norm_eps)
    norm: str = "gate_first"  # see the module docstring
    dt_min: float = 0.0  # time_step_limit, applied to a multi-token pass (as transformers' chunk scan; its
    dt_max: float = float("inf")  # one-token step does not clamp)
    # Falcon-H1's multipliers: the input times in_scale, in_proj's output times its five parts' factors
    # (z, x, B, C, dt: ssm_multipliers, the "mup vector"), the output times out_scale (ssm_out_multiplier)
    in_scale: float = 1.0
    mup: tuple | None = None
    out_scale: float = 1.0
    family: str = "Mamba-2"  # the model family, for messages (granitemoehybrid, falcon_h1)
    norm_rounds: bool = False  # Granite's norm: a bfloat16 step's normed y is rounded before its weight multiplies

    def build(self, dim: int) -> "Mamba2Mixer":
        """The mixer (BlockConfig.mixer's contract, core.recurrent)."""
        if dim != self.dim:
            raise ValueError(f"a Mamba-2 mixer of width {self.dim} cannot sit in a block of width {dim}")
        return Mamba2Mixer(self)

    def __post_init__(self):
        if self.norm not in NORMS:
            raise ValueError(f"unknown Mamba-2 norm {self.norm!r}: use one of {', '.join(NORMS)}")
        if self.num_heads % self.n_groups:
            raise ValueError(f"n_groups ({self.n_groups}) must divide num_heads ({self.num_heads})")

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.n_groups * self.state_size


class MambaState(RecurrentState):
    """One Mamba-2 layer's recurrent cache (core.recurrent.RecurrentState in KVCache.layers[i]): the last K - 1 conv
    inputs `conv` (B, C_conv, K - 1), the SSM state `state` (B, H, P, S), float32, `length` the tokens read; and
    every token's B (B, n, G, S) and dt (B, n, H) so far (`keys_B`, `keys_dt`), from which a generation step's map
    row over all of them is exact (O(n) kept, as a KV cache)."""

    def __init__(self):
        super().__init__()
        self.keys_B: torch.Tensor | None = None
        self.keys_dt: torch.Tensor | None = None


def segment_sums(a: torch.Tensor) -> torch.Tensor:
    """a (..., T) -> (..., T, T): [t, s] = Σ_{r=s+1..t} a_r for s ≤ t, -inf above the diagonal; summed per
    column from the diagonal down (no cum_t - cum_s difference, so a long run loses nothing to cancellation)."""
    T = a.shape[-1]
    below = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), diagonal=-1)
    sums = a[..., :, None].expand(*a.shape, T).masked_fill(~below, 0).cumsum(dim=-2)
    return sums.masked_fill(~torch.tril(below | torch.eye(T, dtype=torch.bool, device=a.device)), float("-inf"))


def _per_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, N, G, S) -> (B, N, H, S): group g serves heads g·H/G .. (g+1)·H/G - 1."""
    return t.repeat_interleave(heads // t.shape[2], dim=2)


def scan_recurrent(x, dt, A, B, C, state=None):
    """The recurrence, one token at a time. x (b, N, H, P), dt (b, N, H), A (H,), B and C (b, N, G, S) ->
    (y (b, N, H, P) without the D skip, the last state (b, H, P, S)); float32."""
    b, N, H, P = x.shape
    B, C = _per_head(B.float(), H), _per_head(C.float(), H)
    h = x.new_zeros(b, H, P, B.shape[-1], dtype=torch.float32) if state is None else state.float()
    ys = []
    for t in range(N):
        decay = torch.exp(dt[:, t].float() * A)  # (b, H)
        h = h * decay[..., None, None] + (dt[:, t, :, None].float() * x[:, t].float())[..., None] * B[:, t, :, None, :]
        ys.append(torch.einsum("bhps,bhs->bhp", h, C[:, t]))
    return torch.stack(ys, dim=1), h


def step_low_precision(x, dt, A, B, C, D, state, gate=None):
    """One generated token in a bfloat16 / float16 model, rounded where transformers' torch selective update rounds
    (its generation step; the prefill's scan keeps float32, as scan_chunked does): dt·B and its product with x in
    the model's dtype, the state in float32, the read-out h·C, the D skip (and the gate z·silu, where the layer's
    norm is only that gate) in the model's dtype. x (b, 1, H, P), dt (b, 1, H), A (H,) float32, B and C
    (b, 1, G, S), D (H,), state (b, H, P, S) float32 -> (y (b, 1, H, P) with the skip, in x's dtype, the state)."""
    b, _, H, P = x.shape
    dtype = x.dtype
    xt, dtt = x[:, 0], dt[:, 0, :, None, None]  # (b, H, P), (b, H, 1, 1)
    Bt, Ct = _per_head(B, H)[:, 0], _per_head(C, H)[:, 0]  # (b, H, S)
    decay = torch.exp(dtt.float() * A[:, None, None])  # (b, H, 1, 1)
    write = (dtt * Bt[:, :, None, :]) * xt[..., None]  # dt·B, then ·x: rounded to the model's dtype at each step
    h = state.float() * decay + write
    y = torch.bmm(h.to(dtype).view(b * H, P, -1), Ct.reshape(b * H, -1, 1)).view(b, H, P)
    y = y + xt * D[:, None].to(dtype)
    if gate is not None:
        y = y * F.silu(gate.view(b, H, P))
    return y[:, None], h


def scan_chunked(x, dt, A, B, C, chunk: int, state=None):
    """The same sum in chunks of `chunk` tokens (SSD): within a chunk, the implicit map times x; between chunks,
    the state carried over (decayed to each token, read by C). Same arguments and results as scan_recurrent."""
    b, N, H, P = x.shape
    B, C = _per_head(B.float(), H), _per_head(C.float(), H)
    xdt = x.float() * dt.float()[..., None]  # x_s · dt_s
    a = dt.float() * A  # (b, N, H)
    h = x.new_zeros(b, H, P, B.shape[-1], dtype=torch.float32) if state is None else state.float()
    ys = []
    for c0 in range(0, N, chunk):
        sl = slice(c0, min(c0 + chunk, N))
        ac = a[:, sl].transpose(1, 2)  # (b, H, Q)
        cum = ac.cumsum(-1)
        L = torch.exp(segment_sums(ac))  # (b, H, Q, Q)
        scores = torch.einsum("bthn,bshn->bhts", C[:, sl], B[:, sl]) * L
        y = torch.einsum("bhts,bshp->bthp", scores, xdt[:, sl])  # this chunk's own tokens
        y = y + torch.einsum("bthn,bhpn->bthp", C[:, sl], h) * torch.exp(cum).transpose(1, 2)[..., None]  # the past
        ys.append(y)
        to_end = torch.exp(cum[..., -1:] - cum)  # (b, H, Q): decay from each token to the chunk's end
        h = h * torch.exp(cum[..., -1])[..., None, None] + torch.einsum(
            "bshn,bhs,bshp->bhpn", B[:, sl], to_end, xdt[:, sl])
    return torch.cat(ys, dim=1), h


def implicit_map(dt, A, B, C) -> torch.Tensor:
    """The implicit attention (b, H, N, N): A[t, s] = (C_t · B_s) · exp(Σ_{r=s+1..t} dt_r A_h) · dt_s, 0 for s > t
    (see the module docstring). dt (b, N, H), A (H,), B, C (b, N, G, S)."""
    H = dt.shape[-1]
    a = (dt.float() * A).transpose(1, 2)  # (b, H, N)
    scores = torch.einsum("bthn,bshn->bhts", _per_head(C.float(), H), _per_head(B.float(), H))
    return scores * torch.exp(segment_sums(a)) * dt.float().transpose(1, 2)[:, :, None, :]


def implicit_tile(dt, A, B, C, rows: slice, cols: slice) -> torch.Tensor:
    """Rows × cols of implicit_map from the per-token quantities alone (b, H, len(rows), len(cols)): O(n) kept,
    O(tile) computed. The decay exp(cum_t - cum_s) is taken from a float64 running sum, so a tile far down a
    long input is as exact as the dense map's."""
    N, H = dt.shape[1], dt.shape[-1]
    r = torch.arange(N, device=dt.device)[rows]
    c = torch.arange(N, device=dt.device)[cols]
    cum = (dt.double() * A.double()).cumsum(1).transpose(1, 2)  # (b, H, N)
    decay = cum[:, :, r, None] - cum[:, :, None, c]
    causal = c[None, :] <= r[:, None]
    decay = torch.exp(decay.masked_fill(~causal, float("-inf"))).float()
    scores = torch.einsum("bthn,bshn->bhts", _per_head(C[:, r].float(), H), _per_head(B[:, c].float(), H))
    return scores * decay * dt[:, c].float().transpose(1, 2)[:, :, None, :]


def band_tile(cum, dt, B, C, a: int, b: int, cols: slice) -> torch.Tensor:
    """One head's A[a:b, cols] (float32) from its running decay sum cum (N,) float64, dt (N,), B, C (N, S). The
    columns before a: the decay exp(cum_t - cum_s) split at a, exp(cum_t - cum_a) · exp(cum_a - cum_s) (each ≤ 1
    for a decaying head, so nothing overflows; a factor underflows only where the product does), folded into C's
    rows and B's rows, one product; the columns from a on: the differences, masked causal."""
    p1 = max(cols.start, min(cols.stop, a))
    u = torch.exp(cum[a:b] - cum[a]).float()
    v = torch.zeros(cols.stop - cols.start, dtype=torch.float64, device=dt.device)  # 0 from a on: set below
    v[:p1 - cols.start] = torch.exp(cum[a] - cum[cols.start:p1]) * dt[cols.start:p1].double()
    out = (C[a:b].float() * u[:, None]) @ (B[cols].float() * v.float()[:, None]).T
    d0, d1 = max(cols.start, a), min(cols.stop, b)
    if d1 > d0:
        r, c = torch.arange(a, b, device=dt.device), torch.arange(d0, d1, device=dt.device)
        decay = (cum[a:b, None] - cum[None, d0:d1]).masked_fill(c[None, :] > r[:, None], float("-inf"))
        out[:, d0 - cols.start:d1 - cols.start] = (C[a:b].float() @ B[d0:d1].float().T) * torch.exp(
            decay).float() * dt[d0:d1].float()[None, :]
    return out


class GatedRMSNorm(nn.Module):
    """The mixer's norm over each group of I / G channels, with the gate z (module docstring's three kinds)."""

    def __init__(self, dim: int, groups: int, eps: float, kind: str):
        super().__init__()
        self.groups, self.eps, self.kind, self.rounds = groups, eps, kind, False
        self.weight = nn.Parameter(torch.ones(dim)) if kind != "gate_only" else None

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z (B, N, I) -> float32 (B, N, I); for a bfloat16 / float16 y (a generation step) with `rounds`
        (Granite's), the normed y rounded to that dtype before its weight multiplies, as transformers does."""
        low = y.dtype in (torch.bfloat16, torch.float16)
        dtype, (y, gate) = y.dtype, (y.float(), F.silu(z.float()))
        if self.kind == "gate_only":  # transformers' silu(z) in z's dtype (Falcon-H1 without its norm)
            return y * F.silu(z).float()
        if self.kind == "gate_first":
            y = y * gate
        g = y.view(*y.shape[:-1], self.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        if low and self.rounds:
            return self.weight * g.view(y.shape).to(dtype)
        y = self.weight.float() * g.view(y.shape)
        return y * gate if self.kind == "norm_first" else y


class Mamba2Mixer(RecurrentMixer):
    """The Mamba-2 mixer in an attention's place: forward(x, opts) -> (out (B, N, D), implicit map (B, H, N, N)
    or None). State-dict names (transformers' own): in_proj, conv1d.weight (C, 1, K) / .bias, dt_bias (H,),
    A_log (H,), D (H,), norm.weight (I,), out_proj.

    Hook points (opts.hooks, relative to blocks.{i}.; core.recurrent's contract): attn.hook_q, C (B, N, G, S);
    attn.hook_k, B (B, N, G, S); attn.hook_v, x per head (B, N, H, P) after the conv (what the map weighs);
    attn.hook_dt, each head's step dt (B, N, H) after softplus (the map's decay and write strength);
    attn.hook_pattern, the implicit map (B, H, N, M) (asking for it computes y = A · x from the map, so a replaced
    map is what weighs x); attn.hook_z, each head's P channels of out_proj's input (B, N, H, P), after the D skip,
    the gate and the norm: zero a head there to ablate it.

    With a cache (opts.kv a MambaState) the state also keeps every token's B and dt, so a generation step's map row
    reaches back over all of them (tiles, exact); a map replaced through the hook needs a fresh state."""

    kind = "mamba2"

    def __init__(self, cfg: Mamba2Config):
        super().__init__()
        c = self.cfg = cfg
        self.num_heads, self.head_dim = c.num_heads, c.head_dim
        self.in_proj = Linear(c.dim, c.inner + c.conv_dim + c.num_heads, bias=c.proj_bias)
        self.conv1d = nn.Conv1d(c.conv_dim, c.conv_dim, c.conv_kernel, groups=c.conv_dim, bias=c.conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(c.num_heads))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, c.num_heads + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(c.num_heads))
        self.norm = GatedRMSNorm(c.inner, c.n_groups, c.eps, c.norm)
        self.norm.rounds = c.norm_rounds
        self.out_proj = Linear(c.inner, c.dim, bias=c.out_bias)
        self.act = activation(c.act)

    def mup(self, proj: torch.Tensor) -> torch.Tensor:
        """Falcon-H1's per-part factors of in_proj's output (z, x, B, C, dt: ssm_multipliers), in proj's dtype."""
        c = self.cfg
        GS = c.n_groups * c.state_size
        sizes = (c.inner, c.inner, GS, GS, c.num_heads)
        return torch.cat([torch.full((n,), float(m), dtype=torch.float32, device=proj.device)
                          for n, m in zip(sizes, c.mup)]).to(proj.dtype)

    def project(self, x: torch.Tensor, state: MambaState | None = None, real: torch.Tensor | None = None):
        """The per-token quantities: (z (B, N, I), x (B, N, H, P), dt (B, N, H) after softplus, B and C
        (B, N, G, S), the conv's last K - 1 inputs (the next conv state)); state (generation) supplies the conv's
        past inputs; real (B, N) zeroes padding tokens' inputs, as transformers does."""
        c = self.cfg
        b, N, _ = x.shape
        if real is not None:
            x = x * real[..., None].to(x.dtype)
        if c.in_scale != 1.0:
            x = x * c.in_scale
        proj = self.in_proj(x)
        if c.mup is not None:
            proj = proj * self.mup(proj)
        z, xBC, dt = proj.split([c.inner, c.conv_dim, c.num_heads], dim=-1)
        xBC = xBC.transpose(1, 2)  # (B, C_conv, N)
        K = c.conv_kernel
        past = xBC.new_zeros(b, c.conv_dim, K - 1) if state is None or state.conv is None else state.conv
        full = torch.cat([past, xBC], dim=-1)
        conv_state = full[..., full.shape[-1] - (K - 1):]
        xBC = self.act(F.conv1d(full.to(self.conv1d.weight.dtype), self.conv1d.weight, self.conv1d.bias,
                                groups=c.conv_dim)).to(x.dtype).transpose(1, 2)  # (B, N, C_conv)
        if real is not None:
            xBC = xBC * real[..., None].to(xBC.dtype)
        GS = c.n_groups * c.state_size
        xs, B, C = xBC.split([c.inner, GS, GS], dim=-1)
        dt = F.softplus(dt + self.dt_bias.to(dt.dtype))
        if N > 1 and (c.dt_min > 0.0 or c.dt_max != float("inf")):  # transformers clamps in its chunk scan only
            dt = dt.clamp(c.dt_min, c.dt_max)
        shape = (b, N, c.n_groups, c.state_size)
        return z, xs.reshape(b, N, c.num_heads, c.head_dim), dt, B.reshape(shape), C.reshape(shape), conv_state

    @property
    def A(self) -> torch.Tensor:
        """Each head's A_h = -exp(A_log_h) (float32): the decay per unit of dt."""
        return -torch.exp(self.A_log.float())

    def skip(self, xs: torch.Tensor) -> torch.Tensor:
        """The D skip term D_h · x_t (B, N, H, P), float32: shown apart from the implicit map."""
        return self.D.float()[:, None] * xs.float()

    def forward(self, x: torch.Tensor, opts=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, N, D). opts (core.attention.AttentionOptions or None): kv, a MambaState (generation);
        need_weights / probs_out, the implicit map; hooks; mask, bool (B, 1, 1, M) padding (1 = real)."""
        b, N, _ = x.shape
        state = getattr(opts, "kv", None)
        lh = getattr(opts, "hooks", None)
        real = self.real_tokens(opts, N)
        fresh = state is None or state.state is None
        z, xs, dt, B, C, conv_state = self.project(x, state, real)
        low = x.dtype in (torch.bfloat16, torch.float16)  # a generation step rounds as transformers' does
        gate = z if self.norm.kind == "gate_only" else None
        if lh is not None:  # head-major at the hooks: C and B per group, x per head
            C = lh("attn.hook_q", C.transpose(1, 2)).transpose(1, 2)
            B = lh("attn.hook_k", B.transpose(1, 2)).transpose(1, 2)
            xs = lh("attn.hook_v", xs.transpose(1, 2)).transpose(1, 2)
            dt = lh("attn.hook_dt", dt)
        want_map = getattr(opts, "need_weights", False) or (lh is not None and lh.wants("attn.hook_pattern"))
        amap = None
        if state is not None:  # the past tokens' B and dt, so a generation step's row reaches back to them
            past_B, past_dt = getattr(state, "keys_B", None), getattr(state, "keys_dt", None)
            state.keys_B = B if past_B is None else torch.cat([past_B, B], dim=1)
            state.keys_dt = dt if past_dt is None else torch.cat([past_dt, dt], dim=1)
        if lh is not None and lh.keep:  # a lazy run: keep B, C, dt and A, from which any tile is exact
            if lh.wants("attn.hook_pattern"):
                raise ValueError(f"{self.cfg.family}: a lazy run keeps no map for a hook on attn.hook_pattern to "
                                 "replace; pass lazy=False")
            # after a kept prefix (prefix reuse): every token's B and dt, the new tokens' C (api.prefix splices)
            every = (state.keys_dt, state.keys_B) if not fresh else (dt, B)
            lh.hooks.kept[lh.index] = KeptMamba(every[0], self.A.detach(), every[1], C, first=every[0].shape[1] - N)
        if want_map and fresh:
            amap = implicit_map(dt, self.A, B, C)
            if lh is not None and lh.wants("attn.hook_pattern"):
                amap = lh("attn.hook_pattern", amap)
            y = torch.einsum("bhts,bshp->bthp", amap, xs.float())  # exact: the map times x is the scan
            last = scan_chunked(xs, dt, self.A, B, C, self.cfg.chunk_size)[1] if state is not None else None
        else:
            if N == 1 and not fresh and low:  # rounded as transformers does: the skip (and a plain gate) in y
                y, last = step_low_precision(xs, dt, self.A, B, C, self.D, state.state, gate)
            elif N == 1 and not fresh:  # one generated token: the recurrence's step (transformers' selective update)
                y, last = scan_recurrent(xs, dt, self.A, B, C, state.state)
            else:
                y, last = scan_chunked(xs, dt, self.A, B, C, self.cfg.chunk_size, None if fresh else state.state)
            if want_map:  # the new tokens' rows over every token read: from the kept B and dt (and the new C)
                M = state.keys_B.shape[1]
                C_all = C.new_zeros(b, M, *C.shape[2:])
                C_all[:, M - N:] = C
                amap = implicit_tile(state.keys_dt, self.A, state.keys_B, C_all, slice(M - N, M), slice(0, M))
                if lh is not None and lh.wants("attn.hook_pattern") and lh("attn.hook_pattern", amap) is not amap:
                    raise ValueError("a Mamba-2 layer's map can be replaced only on a pass from a fresh state (the "
                                     "cached state folds the earlier tokens' values in)")
        if state is not None:
            state.advance(conv_state, last, N)
        stepped = N == 1 and not fresh and low
        y = y.reshape(b, N, -1) if stepped else (y + self.skip(xs)).reshape(b, N, -1)
        y = y if stepped and gate is not None else self.norm(y, z)
        if lh is not None:  # each head's share of out_proj's input: zero one there to ablate the head
            heads = y.view(b, N, self.num_heads, self.head_dim).transpose(1, 2)
            y = lh("attn.hook_z", heads).transpose(1, 2).reshape(b, N, -1)
        out = self.out_proj(y.to(x.dtype))
        if self.cfg.out_scale != 1.0:
            out = out * self.cfg.out_scale
        return out, self.hand_out(amap, opts) if amap is not None and getattr(opts, "need_weights", False) else None


class KeptMamba:
    """What a lazy run keeps of one Mamba-2 layer instead of its maps (core.hooks.Hooks.kept[layer]): dt (B, N, H),
    A (H,), B and C (B, N, G, S): O(n) numbers, from which `view` computes any part of any head's map exactly
    (batch row 0). The maps are signed: a pooled cell's "max" is its entry of largest magnitude, sign kept."""

    kind = "mamba2"

    def __init__(self, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, first: int = 0):
        self.dt, self.A, self.B, self.C = dt, A, B, C
        self.first = first  # C holds the rows from token `first` on (a pass after a kept prefix; see splice)

    def splice(self, old: "KeptMamba", p: int) -> "KeptMamba":
        """Prefix reuse: the kept run's first p rows of C before this pass's (which began at token p)."""
        if self.first != p:
            raise ValueError(f"this pass began at token {self.first}, not {p}")
        return KeptMamba(self.dt, self.A, self.B, torch.cat([old.C[:, :p], self.C], dim=1))

    @property
    def heads(self) -> int:
        return int(self.dt.shape[-1])

    @property
    def n(self) -> int:
        return int(self.dt.shape[1])

    m = n  # keys: the same tokens

    def tensors(self) -> list[torch.Tensor]:
        return [self.dt, self.A, self.B, self.C]

    def tile(self, head: int, rows: slice, cols: slice) -> torch.Tensor:
        """Head `head`'s A[rows, cols] (len(rows), len(cols)), float32."""
        g = head // (self.heads // self.B.shape[2])
        one = slice(head, head + 1)
        return implicit_tile(self.dt[:1, :, one], self.A[one], self.B[:1, :, g:g + 1], self.C[:1, :, g:g + 1],
                             rows, cols)[0, 0]

    def pooled(self, head: int, row_edges, col_edges, reduce: str, rows: slice, cols: slice, check=None,
               block: int = 1 << 22) -> torch.Tensor:
        """(len(row_edges) - 1, len(col_edges) - 1) cells over A[rows, cols], each the mean or the signed entry of
        largest magnitude ("max") of its block; computed a band of rows at a time (about `block` entries), each
        band only over the columns its rows can see (core.cell_pool)."""
        g = head // (self.heads // self.B.shape[2])
        pool = CellPool(row_edges, col_edges, reduce, rows, cols, self.dt.device)
        step = max(1, min(256, block // max(1, cols.stop - cols.start)))  # short bands: little exact-decay work
        cum = (self.dt[0, :, head].double() * self.A[head].double()).cumsum(0)
        for a in range(rows.start, rows.stop, step):
            b = min(rows.stop, a + step)
            width = pool.visible(b)
            pool.add(a, b, band_tile(cum, self.dt[0, :, head], self.B[0, :, g], self.C[0, :, g], a, b,
                                     slice(cols.start, cols.start + width)))
            if check is not None:
                check()
        return pool.result()
