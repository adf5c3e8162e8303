"""Offer bfloat16 where it pays (issue 24 B): after a long float32 run on a CPU that multiplies bfloat16 natively
(avx512_bf16 or amx_bf16, core.bf16.native_bf16), the status line says about how long the same forward would take
in bfloat16, with a one-click switch. Nothing here changes the dtype: the window's button does, through the dtype
picker, when the user clicks it.

The estimate: Y is the float32 run's measured forward. In a worker (lane LANE), the model's own linear shapes and
one causal attention kernel of its heads' width are timed in float32 and in bfloat16 on this machine
(core.bf16_rate, once per process and shapes, well under a second). At the float32 rates the run's products and
attention would take A32 of Y (at most all of it: share f = min(1, A32 / Y)); those speed up by the measured
r = A16 / A32, the rest of the forward (norms, masks, copies) is taken as unchanged:

    X = Y · (1 − f + f · r)

It is offered when the run was long (at least LONG_TOKENS tokens and LONG_FORWARD_S seconds: a reload in
bfloat16 costs seconds itself), whole (not a reused prefix's new rows, not a layer of a run in flight), on the
CPU, and X ≤ PAYS · Y. The offer goes with what it describes: a new input, a model load (a switch or a dtype
change) or a cleared input take it away, and a new run's result replaces it.

Torch is imported inside the job only: the window imports this module.
"""
from __future__ import annotations

import re
from typing import Any

from PySide6.QtCore import QObject, Signal

from attn_explorer.session.live_run import incomplete
from attn_explorer.session.long_view import reused_prefix

LANE = "bf16-offer"
LONG_TOKENS = 1024  # fewer tokens: the forward is short, and a reload in bfloat16 would cost more than it saves
LONG_FORWARD_S = 3.0  # a shorter float32 forward is not worth a reload
PAYS = 0.8  # offered when bfloat16 would take at most this share of the float32 forward
WINDOW = re.compile(r"window (\d+)")


def attention_pairs(n: int, kinds: tuple[str, ...], causal: bool, layers: int,
                    mixers: tuple[str, ...] = ()) -> float:
    """Query-key pairs one head computes, summed over the layers: n² where every token sees every other, n(n+1)/2
    for a causal layer, Σ min(i + 1, w) for a causal layer that sees its last w tokens ("local, window w"), none for
    a recurrent layer (mixers other than "softmax")."""
    total = 0.0
    for layer in range(int(layers)):
        if layer < len(mixers) and mixers[layer] != "softmax":
            continue
        m = WINDOW.search(kinds[layer]) if layer < len(kinds) else None
        w = int(m.group(1)) if m else None
        if not causal:
            total += n * n
        elif w is not None and w < n:
            total += n * w - w * (w - 1) / 2
        else:
            total += n * (n + 1) / 2
    return total


def estimate(forward_s: float, tokens: int, rates: dict, heads: int, pairs: float) -> dict:
    """The bfloat16 forward, from the float32 one (forward_s) and the measured rates (core.bf16_rate.measure_rates):
    {"f32_s", "bf16_s", "ratio", "share" (f), "products_ratio", "attn_ratio", "tokens"}."""
    f32, b16 = rates["float32"], rates["bfloat16"]
    lin32, lin16 = f32["linear_s_per_token"] * tokens, b16["linear_s_per_token"] * tokens
    att32, att16 = f32["attn_s_per_pair"] * heads * pairs, b16["attn_s_per_pair"] * heads * pairs
    a32, a16 = lin32 + att32, lin16 + att16
    y = float(forward_s)
    share = min(1.0, a32 / y) if y > 0 and a32 > 0 else 0.0
    ratio = 1.0 - share + share * (a16 / a32) if a32 > 0 else 1.0
    return {"f32_s": y, "bf16_s": y * ratio, "ratio": ratio, "share": share, "tokens": int(tokens),
            "products_ratio": (b16["linear_s_per_token"] / f32["linear_s_per_token"]
                               if f32["linear_s_per_token"] else 1.0),
            "attn_ratio": b16["attn_s_per_pair"] / f32["attn_s_per_pair"] if f32["attn_s_per_pair"] else 1.0}


def estimate_job(model: Any, tokens: int, forward_s: float) -> dict:
    """In a worker: {"native": False} where this CPU has no native bfloat16 (or the model no module to read its
    shapes from), else {"native": True, **estimate(...)} from the model's own shapes timed here."""
    from attn_explorer.core import bf16 as core_bf16

    module = getattr(model, "module", None)
    if not core_bf16.native_bf16() or module is None:
        return {"native": False}
    from attn_explorer.core.bf16_rate import measure_rates, model_shapes

    info = model.info
    heads = int(info.num_heads)
    shapes, head_dim = model_shapes(module, heads)
    rates = measure_rates(shapes, heads, head_dim)
    pairs = attention_pairs(int(tokens), tuple(info.layer_kinds), bool(info.causal), int(info.num_layers),
                            tuple(getattr(info, "mixers", ()) or ()))
    return {"native": True, "measured_s": rates.get("seconds", 0.0),
            **estimate(forward_s, int(tokens), rates, heads, pairs)}


def why_not(info: Any, r: Any) -> str:
    """Why a run gets no offer, in words ("" when it may get one, if the estimate says it pays)."""
    if info is None or r is None:
        return "no run"
    if info.dtype != "float32":
        return f"the model is {info.dtype}, not float32"
    if info.device != "cpu":
        return f"the model runs on {info.device}, not the cpu"
    if incomplete(r):
        return "the run is not whole yet"
    if reused_prefix(r) > 0:
        return "the forward reused a prefix: its time is the new tokens' only"
    if r.num_tokens < LONG_TOKENS:
        return f"{r.num_tokens:,} tokens: fewer than {LONG_TOKENS:,}"
    if r.forward_ms < LONG_FORWARD_S * 1000:
        return f"a forward of {r.forward_ms / 1000:.1f} s: under {LONG_FORWARD_S:g} s"
    return ""


def _s(x: float) -> str:
    return f"{x:.1f} s" if x < 10 else f"{x:.0f} s"


def offer_variants(d: dict) -> tuple[str, ...]:
    """The offer in words, longest first: the window shows the longest that fits (the tooltip has all of it).
    Where the float32 run shared the cores (d["beside"]), both figures are high, and every variant says so."""
    x, y = _s(d["bf16_s"]), _s(d["f32_s"])
    if d.get("beside"):
        return (f"bfloat16 would take about {x} instead of {y} (both timed beside other jobs, so both high; "
                "estimated from measured product rates)",
                f"bfloat16 would take about {x} instead of {y} (timed beside other jobs; estimated)",
                f"bfloat16: about {x}, not {y} (beside other jobs)",
                f"bf16 ≈ {x}, not {y} (beside other jobs)",
                f"bf16 ≈ {x} (beside other jobs)")
    return (f"bfloat16 would take about {x} instead of {y} "
            "(estimated from measured product rates; its maps round a little, see vs float32)",
            f"bfloat16 would take about {x} instead of {y} (estimated; maps round a little, see vs float32)",
            f"bfloat16 would take about {x} instead of {y} (estimated)",
            f"bfloat16: about {x}, not {y}",
            f"bfloat16 ≈ {x}, not {y}",
            f"bf16 ≈ {x}, not {y}",
            f"bf16 ≈ {x}")  # the last resort of a crowded status bar: its forward label says Y


def offer_text(d: dict) -> tuple[str, str]:
    """The status line's offer and its tooltip (the whole line, then how it was estimated), from estimate_job's
    answer."""
    line = offer_variants(d)[0]
    first = " (a first run: that includes one-off start-up costs)" if d.get("warm_up") else ""
    if d.get("beside"):  # SessionState.shared_cores: the run shared the cores, so both times are high
        first += " (beside other jobs: the model alone takes less, and so would bfloat16)"
    tip = (f"{line}.\n\nThis float32 forward took {_s(d['f32_s'])} for {d['tokens']:,} tokens{first}. "
           "On this CPU (native bfloat16) the "
           f"model's own products ran {1 / max(d['products_ratio'], 1e-9):.1f}× as fast in bfloat16 and its attention "
           f"kernel {1 / max(d['attn_ratio'], 1e-9):.1f}× (timed here); at float32 rates they make about "
           f"{d['share']:.0%} of the forward, and the rest is taken as unchanged: about {_s(d['bf16_s'])} in "
           "bfloat16. Switching reloads the model in bfloat16 and runs the input again; its maps then differ a "
           "little from float32, and the vs float32 button measures by how much. Nothing switches unless you click.")
    return line, tip


def _same(a: tuple | None, b: tuple | None) -> bool:
    """The same model object (not an equal one loaded again), tokens and forward time."""
    return a is not None and b is not None and a[0] is b[0] and a[1:] == b[1:]


class Bf16Offer(QObject):
    """The offer for the result on screen: `line` and `tip` ("" when none), `changed` when they change."""

    changed = Signal(str)  # the line, "" when the offer went

    def __init__(self, state: Any, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self.line = self.tip = ""
        self.variants: tuple[str, ...] = ()  # the line, and shorter ways of saying it (offer_variants)
        self._key: tuple | None = None  # (model info, tokens, forward ms) the offer (or its estimate) is for
        state.attention_ready.connect(self._arrived)
        for sig in (state.text_changed, state.target_changed, state.model_loading, state.model_loaded):
            sig.connect(lambda *_: self.clear())
        state.input_cleared.connect(self.clear)

    def clear(self) -> None:
        if self._key is not None:
            self.state.cancel(LANE)
        self._key = None
        self.variants = ()
        self._set("", "")

    def _set(self, line: str, tip: str) -> None:
        if (line, tip) != (self.line, self.tip):
            self.line, self.tip = line, tip
            self.changed.emit(line)

    def _arrived(self, r: Any) -> None:
        if incomplete(r):
            return  # a layer of a run in flight: the run's own result decides
        st = self.state
        key = (st.info, r.num_tokens, float(r.forward_ms))
        if _same(key, self._key):
            return  # the same run drawn again (hide specials, the stack shown): the offer stays
        self.clear()
        if why_not(st.info, r):
            return
        self._key = key
        st.submit(estimate_job, int(r.num_tokens), float(r.forward_ms) / 1000, key=LANE,
                  on_result=lambda d: self._estimated(key, d), on_error=lambda _m: self._failed(key))

    def _estimated(self, key: tuple, d: dict) -> None:
        if not _same(key, self._key) or not d.get("native") or d["bf16_s"] > PAYS * d["f32_s"]:
            return
        r = self.state.result
        d = {**d, "warm_up": bool(getattr(r, "warm_up", False)), "beside": bool(self.state.shared_cores(r))}
        self.variants = offer_variants(d)
        self._set(*offer_text(d))

    def _failed(self, key: tuple) -> None:
        if _same(key, self._key):  # no estimate, no offer: the user loses nothing but the suggestion
            self._set("", "")
