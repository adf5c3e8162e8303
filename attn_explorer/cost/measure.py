"""The cost lab's measuring loop: time and peak memory of each attention variant against n.

``sweep(config)`` is a generator. It yields one ``Measurement`` per (n, variant) as soon as that
point is measured, so a GUI worker can stream points to a plot and the CLI can print rows as
they come. It takes a ``cancelled()`` callable, polled between runs, and a
``progress(done, total, message)`` callback.

For each point:
1. The memory guard predicts the bytes the run needs (inputs, the kept reference output, and
   ``memory.predict_bytes``). Over budget: a "skipped" record, and the variant is never called.
2. One call under the memory probe (see memory.py). It is also the warm-up, so never timed.
3. ``repeats`` timed calls (fewer if ``time_budget_s`` runs out, never fewer than one); the
   median is reported. On CUDA the clock waits for the device (synchronize) on both sides.
4. The output is compared with exact attention's output for the same inputs: naive's when it
   ran at this n, else SDPA's (also exact). Errors are relative Frobenius norms.
An exception in a variant (out of memory, say) gives a "failed" record; the sweep goes on.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import torch

from attn_explorer.core.device import DTYPES, pick_device
from attn_explorer.core.efficient import EXACT, VARIANTS
from attn_explorer.cost.memory import default_budget, elem_bytes, human_bytes, matrix_bytes, predict_bytes, \
    run_measuring_memory

REFERENCES = ("naive", "sdpa")  # exact variants an error can be measured against, in preference order


@dataclass
class SweepConfig:
    """What to measure. Every field has a default except the sizes."""

    ns: list[int]  # sequence lengths, measured in this order
    impls: list[str] = field(default_factory=lambda: list(VARIANTS))  # variant names, see VARIANTS
    heads: int = 12  # H
    d_k: int = 64  # per-head width of q, k and v
    batch: int = 1  # B
    dtype: str = "float32"  # float32, bfloat16 or float16 (the last two on a GPU)
    device: str = "cpu"  # a torch device string
    causal: bool = False  # decoder-style masking for every variant
    repeats: int = 3  # timed runs per point; the median is reported
    time_budget_s: float | None = None  # stop timing a point after this many seconds (>= 1 run)
    window: int = 128  # window attention's window (tokens)
    q_block: int | None = None  # chunked attention's query tile; None = core.efficient.auto_q_block(n)
    k_block: int = 256  # chunked attention's key tile
    budget_bytes: int | None = None  # memory guard; None = memory.default_budget(device)
    seed: int = 0  # q, k, v are drawn from N(0, 1) with this seed, per n

    def validate(self) -> None:
        """Raise ValueError, with one line saying what is wrong."""
        if not self.ns:
            raise ValueError("no sequence lengths to measure")
        for n in self.ns:
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"sequence length must be a positive integer, got {n!r}")
        if not self.impls:
            raise ValueError("no variants to measure")
        for impl in self.impls:
            if impl not in VARIANTS:
                raise ValueError(f"unknown variant {impl!r}: choose from {', '.join(VARIANTS)}")
        for name in ("heads", "d_k", "batch", "repeats", "window", "q_block", "k_block"):
            value = getattr(self, name)
            if name == "q_block" and value is None:
                continue
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}: use float32, bfloat16 or float16")
        if self.budget_bytes is not None and not (self.budget_bytes > 0 and math.isfinite(self.budget_bytes)):
            raise ValueError(f"memory budget must be a positive number of bytes, got {self.budget_bytes!r}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"time budget must be positive, got {self.time_budget_s!r}")


@dataclass
class Measurement:
    """One (n, variant) point. Plain data: safe to send across threads and to write as JSON."""

    n: int
    impl: str
    status: str  # "ok", "skipped" (the guard refused it) or "failed" (it raised)
    ms: float | None = None  # median wall time of the timed runs
    ms_runs: list[float] = field(default_factory=list)  # every timed run, in order
    peak_bytes: int | None = None  # measured: bytes of tensors made during one call, at their peak
    predicted_bytes: int = 0  # what the guard expected the call itself to need
    matrix_bytes: int = 0  # bytes of the exact (B, H, n, n) attention matrix, for scale
    rel_error: float | None = None  # ‖out − exact‖ / ‖exact‖ (Frobenius), when a reference ran
    max_abs_error: float | None = None  # max |out − exact|
    reference: str | None = None  # which exact variant the error is against
    memory_method: str | None = None  # "cpu-profiler", "cuda-allocator", or None (not measured)
    message: str = ""  # why it was skipped or how it failed

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_device(name: str) -> str:
    """'auto', 'cpu', 'cuda', 'cuda:1', 'mps' -> a device string torch accepts; ValueError if absent."""
    return str(pick_device(name))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def variant_kwargs(impl: str, cfg: SweepConfig) -> dict:
    """The extra keyword arguments a variant takes from the config."""
    if impl == "chunked":
        return {"q_block": cfg.q_block, "k_block": cfg.k_block}
    if impl == "window":
        return {"window": cfg.window}
    return {}


def predicted_need(impl: str, n: int, cfg: SweepConfig) -> tuple[int, int]:
    """(bytes the call needs, bytes the whole point needs: + q, k, v, the kept reference and output)."""
    e = elem_bytes(DTYPES[cfg.dtype])
    call = predict_bytes(impl, n, cfg.heads, cfg.d_k, cfg.batch, e, window=cfg.window, q_block=cfg.q_block,
                         k_block=cfg.k_block, causal=cfg.causal)
    x = cfg.batch * cfg.heads * n * cfg.d_k * e
    return call, call + 5 * x


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def _errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    diff = (out.float() - ref.float())
    ref_norm = torch.linalg.vector_norm(ref.float()).item()
    rel = torch.linalg.vector_norm(diff).item() / ref_norm if ref_norm > 0 else float("nan")
    return rel, diff.abs().max().item()


def _measure_point(impl: str, n: int, q, k, v, cfg: SweepConfig, device: torch.device,
                   cancelled: Callable[[], bool]) -> tuple[Measurement, torch.Tensor] | None:
    """Memory run (also the warm-up), then the timed runs. None if cancelled on the way."""
    fn = VARIANTS[impl]
    kwargs = variant_kwargs(impl, cfg)

    def call():
        return fn(q, k, v, causal=cfg.causal, **kwargs)

    with torch.no_grad():
        out, peak, method = run_measuring_memory(call, device)
        runs: list[float] = []
        began = time.perf_counter()
        for _ in range(cfg.repeats):
            if cancelled():
                return None
            _sync(device)
            t0 = time.perf_counter()
            call()
            _sync(device)
            runs.append((time.perf_counter() - t0) * 1000.0)
            if cfg.time_budget_s is not None and time.perf_counter() - began > cfg.time_budget_s:
                break
    rec = Measurement(n=n, impl=impl, status="ok", ms=statistics.median(runs), ms_runs=runs, peak_bytes=peak,
                      memory_method=method)
    return rec, out


def sweep(cfg: SweepConfig, cancelled: Callable[[], bool] | None = None,
          progress: Callable[[int, int, str], None] | None = None) -> Iterator[Measurement]:
    """Measure every (n, variant) of cfg, yielding each Measurement as soon as it is done.

    cancelled() is polled before every call; when it turns true the generator returns.
    progress(done, total, message) is called before each point and once at the end.
    """
    cfg.validate()
    cancelled = cancelled or (lambda: False)
    progress = progress or (lambda done, total, message: None)
    device = torch.device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    budget = cfg.budget_bytes if cfg.budget_bytes is not None else default_budget(device)
    # references first, so every other variant at this n can be compared with one
    impls = [i for i in REFERENCES if i in cfg.impls] + [i for i in cfg.impls if i not in REFERENCES]
    total, done = len(cfg.ns) * len(impls), 0
    for n in cfg.ns:
        needs = {impl: predicted_need(impl, n, cfg) for impl in impls}
        q = k = v = None
        if any(need <= budget for _, need in needs.values()):
            g = torch.Generator(device=device).manual_seed(cfg.seed + n)
            shape = (cfg.batch, cfg.heads, n, cfg.d_k)
            q, k, v = (torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(3))  # (B, H, N, d_k)
        ref: tuple[str, torch.Tensor] | None = None
        for impl in impls:
            if cancelled():
                return
            progress(done, total, f"n = {n}: {impl}")
            call_bytes, need = needs[impl]
            base = dict(n=n, impl=impl, predicted_bytes=call_bytes,
                        matrix_bytes=matrix_bytes(n, cfg.heads, cfg.batch, elem_bytes(dtype)))
            if need > budget:
                yield Measurement(status="skipped", **base,
                                  message=f"skipped: would need {human_bytes(need)} (budget {human_bytes(budget)})")
            else:
                try:
                    got = _measure_point(impl, n, q, k, v, cfg, device, cancelled)
                except Exception as exc:  # noqa: BLE001 - out of memory and friends: mark the point, go on
                    got = Measurement(status="failed", **base, message=_one_line(exc))
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                if got is None:
                    return
                if isinstance(got, Measurement):
                    yield got
                else:
                    rec, out = got
                    rec.predicted_bytes, rec.matrix_bytes = base["predicted_bytes"], base["matrix_bytes"]
                    if ref is not None:
                        rec.reference = ref[0]
                        rec.rel_error, rec.max_abs_error = _errors(out, ref[1])
                    if ref is None and impl in REFERENCES and impl in EXACT:
                        ref = (impl, out)
                    del out
                    yield rec
            done += 1
        del q, k, v, ref
    progress(done, total, "done")
