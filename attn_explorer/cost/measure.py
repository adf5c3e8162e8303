"""The cost lab's measuring loop: time and peak memory of each attention variant against n.

``sweep(config)`` is a generator. It yields a ``Progress`` before every call (what runs next, how
far along, and the estimated seconds left) and one ``Measurement`` per (n, variant) once that
point is measured, so a GUI worker can stream points to a plot and the CLI can print rows as they
come. A generator worker can stop it at any yield; ``cancelled()``, polled before every call, does
the same for plain loops.

At each n:
1. The memory guard predicts the bytes each point needs (``variants.point_bytes``). Over budget:
   a "skipped" record, and the variant is never called.
2. One call per variant under the memory probe (see memory.py). It is also the warm-up, so never
   timed. Its output is compared with exact attention's output for the same inputs: naive's when
   it ran at this n, else SDPA's. Errors are relative Frobenius norms, ‖out − exact‖ / ‖exact‖.
3. ``repeats`` rounds of timed calls, one call per variant per round, the order rotating each
   round. Interleaving means a burst of load from another program hits every variant alike,
   instead of all of one variant's runs. A round is not started once ``time_budget_s`` per
   variant is spent (at least one round always runs). The median is reported with the min–max
   spread. On CUDA the clock waits for the device (synchronize) on both sides.
An exception in a variant (out of memory, say) gives a "failed" record; the sweep goes on.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import torch

from attn_explorer.core.device import DTYPES, pick_device
from attn_explorer.cost.config import SweepConfig
from attn_explorer.cost.estimate import PointCost, remaining_seconds
from attn_explorer.cost.memory import default_budget, elem_bytes, human_bytes, matrix_bytes, run_measuring_memory
from attn_explorer.cost.variants import REFERENCES, get, point_bytes
from attn_explorer.errors import error_message


@dataclass
class Measurement:
    """One (n, variant) point. Plain data: safe to send across threads and to write as JSON."""

    n: int
    impl: str
    status: str  # "ok", "skipped" (the guard refused it) or "failed" (it raised)
    ms: float | None = None  # median wall time of the timed runs
    ms_min: float | None = None  # fastest timed run: with ms_max, the spread the plots draw
    ms_max: float | None = None  # slowest timed run
    ms_runs: list[float] = field(default_factory=list)  # every timed run, in order
    peak_bytes: int | None = None  # measured: bytes of tensors made during one call, at their peak
    predicted_bytes: int = 0  # what the guard expected the call itself to need
    matrix_bytes: int = 0  # bytes of the exact (B, H, n, n) attention matrix, for scale
    rel_error: float | None = None  # ‖out − exact‖ / ‖exact‖ (Frobenius), when a reference ran
    max_abs_error: float | None = None  # max |out − exact|
    reference: str | None = None  # which exact variant the error is against
    memory_method: str | None = None  # "cpu-profiler", "cuda-allocator", or None (not measured)
    seconds: float = 0.0  # wall time spent measuring this point, warm-up included
    # time.perf_counter() when its n's timed rounds began and ended (every variant's runs interleave in them): what
    # ran beside them shared the cores (session.cost_sweep asks the session's runner)
    timed_from: float | None = None
    timed_to: float | None = None
    message: str = ""  # why it was skipped or how it failed

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Progress:
    """Where a sweep stands, yielded before every call."""

    done: int  # calls made so far (warm-ups and timed runs)
    total: int  # calls the whole sweep will make (fewer if a time budget cuts rounds short)
    message: str  # what runs next
    eta_s: float | None  # estimated seconds left; None until every variant has one point

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_device(name: str) -> str:
    """'auto', 'cpu', 'cuda', 'cuda:1', 'mps' -> a device string torch accepts; ValueError if absent."""
    return str(pick_device(name))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(‖out − ref‖ / ‖ref‖, max |out − ref|), in float32 whatever the dtype."""
    diff = out.float() - ref.float()
    ref_norm = torch.linalg.vector_norm(ref.float()).item()
    rel = torch.linalg.vector_norm(diff).item() / ref_norm if ref_norm > 0 else float("nan")
    return rel, diff.abs().max().item()


def timed_call(call: Callable[[], object], device: torch.device) -> float:
    """Milliseconds of one call, the device drained on both sides."""
    with torch.no_grad():
        sync(device)
        t0 = time.perf_counter()
        call()
        sync(device)
    return (time.perf_counter() - t0) * 1000.0


def _caller(impl: str, q, k, v, cfg: SweepConfig) -> Callable[[], torch.Tensor]:
    variant = get(impl)
    fn, kwargs = variant.kernel, variant.kwargs(cfg)
    return lambda: fn(q, k, v, causal=cfg.causal, **kwargs)


def sweep(cfg: SweepConfig, cancelled: Callable[[], bool] | None = None) -> Iterator[Measurement | Progress]:
    """Measure every (n, variant) of cfg; see the module docstring for the order of work."""
    cfg.validate()
    cancelled = cancelled or (lambda: False)
    device = torch.device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    budget = cfg.budget_bytes if cfg.budget_bytes is not None else default_budget(device)
    # references first, so every other variant at this n can be compared with one
    impls = [i for i in REFERENCES if i in cfg.impls] + [i for i in cfg.impls if i not in REFERENCES]
    needs = {(n, i): point_bytes(i, n, cfg) for n in cfg.ns for i in impls}
    growth = {i: get(i).growth for i in impls}
    per_point = 1 + cfg.repeats
    total = per_point * sum(need <= budget for _, need in needs.values())
    done = 0
    seen: dict[str, PointCost] = {}  # each variant's latest measured point, for the estimate

    for index, n in enumerate(cfg.ns):
        runnable = [i for i in impls if needs[n, i][1] <= budget]
        later = [(m, i) for m in cfg.ns[index + 1:] for i in impls if needs[m, i][1] <= budget]
        began_n = time.perf_counter()

        def eta() -> float | None:
            rest = remaining_seconds(seen, later, growth, cfg.repeats, cfg.time_budget_s)
            here = remaining_seconds(seen, [(n, i) for i in runnable], growth, cfg.repeats, cfg.time_budget_s)
            if rest is None or here is None:
                return None
            return rest + max(0.0, here - (time.perf_counter() - began_n))

        base = {i: dict(n=n, impl=i, predicted_bytes=needs[n, i][0],
                        matrix_bytes=matrix_bytes(n, cfg.heads, cfg.batch, elem_bytes(dtype))) for i in impls}
        for impl in impls:
            if impl not in runnable:
                need = needs[n, impl][1]
                yield Measurement(status="skipped", **base[impl],
                                  message=f"skipped: would need {human_bytes(need)} (budget {human_bytes(budget)})")
        if not runnable:
            continue
        g = torch.Generator(device=device).manual_seed(cfg.seed + n)
        shape = (cfg.batch, cfg.heads, n, cfg.d_k)
        q, k, v = (torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(3))  # (B, H, N, d_k)

        # 1. one call each under the memory probe: the warm-up, and the output for the error
        live: dict[str, tuple[Measurement, Callable[[], torch.Tensor], float]] = {}
        done_recs: list[Measurement] = []
        ref: tuple[str, torch.Tensor] | None = None
        for impl in runnable:
            yield Progress(done, total, f"n = {n:,}: {impl}, first call (memory)", eta())
            if cancelled():
                return
            call = _caller(impl, q, k, v, cfg)
            t0 = time.perf_counter()
            try:
                with torch.no_grad():
                    out, peak, method = run_measuring_memory(call, device)
            except Exception as exc:  # noqa: BLE001 - out of memory and friends: mark the point, go on
                done_recs.append(Measurement(status="failed", **base[impl], message=error_message(exc)))
                done += per_point
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            rec = Measurement(status="ok", **base[impl], peak_bytes=peak, memory_method=method)
            if ref is not None:
                rec.reference = ref[0]
                rec.rel_error, rec.max_abs_error = errors(out, ref[1])
            elif impl in REFERENCES:
                ref = (impl, out)
            del out
            live[impl] = (rec, call, time.perf_counter() - t0)
            done += 1

        # 2. timed rounds, interleaved, the order rotating so no variant always goes first
        began = time.perf_counter()
        cap = None if cfg.time_budget_s is None else cfg.time_budget_s * max(1, len(live))
        rounds = 0
        while rounds < cfg.repeats and live and (rounds == 0 or cap is None or time.perf_counter() - began <= cap):
            names = list(live)
            shift = rounds % len(names)
            for impl in names[shift:] + names[:shift]:
                yield Progress(done, total, f"n = {n:,}: {impl}, run {rounds + 1} of {cfg.repeats}", eta())
                if cancelled():
                    return
                rec, call, _ = live[impl]
                try:
                    rec.ms_runs.append(timed_call(call, device))
                except Exception as exc:  # noqa: BLE001 - it worked once and failed now: still a failure
                    rec.status, rec.message = "failed", error_message(exc)
                    rec.ms_runs.clear()
                    done_recs.append(rec)
                    del live[impl]
                    done += cfg.repeats - rounds
                    continue
                done += 1
            rounds += 1
        done += (cfg.repeats - rounds) * len(live)  # rounds the time budget cut

        ended = time.perf_counter()
        for impl, (rec, _, warm_s) in live.items():
            runs = rec.ms_runs
            rec.ms, rec.ms_min, rec.ms_max = statistics.median(runs), min(runs), max(runs)
            rec.seconds = warm_s + sum(runs) / 1000.0
            rec.timed_from, rec.timed_to = began, ended
            seen[impl] = PointCost(n=n, warm_s=warm_s, run_s=rec.ms / 1000.0)
        order = {impl: i for i, impl in enumerate(impls)}
        for rec in sorted([r for r, _, _ in live.values()] + done_recs, key=lambda r: order[r.impl]):
            yield rec
        del q, k, v, ref, live
    yield Progress(total, total, "done", 0.0)
