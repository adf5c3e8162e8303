"""The cost lab's session object: it runs the measuring sweep and the model-q/k/v comparison in
workers and hands the Cost page plain data. No widgets here.

The sweep is `cost.measure.sweep`, a generator run in the side-job lane "cost-sweep" (no model), and
the q/k/v comparison a job in the lane "cost-qkv" (on the model): the session's lanes (`Runner.submit`),
or this object's own Runner when it has no session. Each yielded Measurement arrives as
`point_measured` (a dict), each yielded Progress as `progressed` with the estimated time left.
Cancelling the lane stops the generator at its next yield, which comes before every call, and drops
whatever is still on its way; `sweep_finished("cancelled")` is said at once. Newest wins in a lane, so
a sweep started right after a cancel waits for the cancelled call to end instead of timing beside it.

The page may not import cost/ (import-linter: the GUI never touches the floors below the session),
so what it needs from there (the variant registry, the memory guard and budget, fits, the noise
verdict, byte and time formatting) is offered here, as plain data.
"""
from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

from attn_explorer.cost import variants as _variants
from attn_explorer.cost.config import SweepConfig
from attn_explorer.cost.estimate import PointCost, human_seconds, predict_seconds, prior_seconds
from attn_explorer.cost.fit import FIT_RULE, noise_verdict, slopes
from attn_explorer.cost.fit import GROWTH as FIT_GROWTH
from attn_explorer.cost.memory import default_budget, human_bytes, matrix_bytes
from attn_explorer.errors import UserError
from attn_explorer.session.runner import SHARED_SHARE, Runner, Task

__all__ = ["CostSweep", "VARIANTS", "FIT_RULE", "FIT_GROWTH", "human_bytes", "human_seconds", "matrix_bytes", "fitted_slopes",
           "noise_line", "largest_fitting_n", "budget_bytes", "estimate_seconds"]

# The registry as plain data: name -> label, colour, blurb, exact
VARIANTS: dict[str, dict[str, Any]] = {
    v.name: {"label": v.label, "colour": v.colour, "blurb": v.blurb, "exact": v.exact}
    for v in _variants.VARIANTS.values()
}
QKV_REPEATS = 5
SWEEP_LANE = "cost-sweep"
QKV_LANE = "cost-qkv"

_budgets: dict[str, int] = {}


def budget_bytes(device: str) -> int:
    """The memory guard's default budget for a device (read once per device)."""
    if device not in _budgets:
        try:
            _budgets[device] = default_budget(device)
        except (RuntimeError, AssertionError):  # no such device here (torch without CUDA asserts): the run says so
            _budgets[device] = default_budget("cpu")
    return _budgets[device]


def largest_fitting_n(settings: dict, budget: int, candidates: list[int]) -> int | None:
    """The largest of `candidates` at which some variant of settings["impls"] fits the budget."""
    cfg = SweepConfig(**(settings | {"ns": [1]}))
    fitting = [n for n in candidates if any(_variants.fits(i, n, cfg, budget) for i in cfg.impls)]
    return max(fitting) if fitting else None


def estimate_seconds(points: list[dict], settings: dict, n: int) -> float:
    """About how many seconds measuring settings["impls"] at n takes: each variant scaled from its
    largest measured point among `points` (same settings), or a pessimistic prior when it has none."""
    cfg = SweepConfig(**(settings | {"ns": [n]}))
    total = 0.0
    for impl in cfg.impls:
        seen = [p for p in points if p["impl"] == impl and p["status"] == "ok" and p.get("ms")]
        if not seen:
            total += prior_seconds(n, cfg.heads, cfg.d_k, cfg.batch, cfg.repeats, cfg.device, cfg.time_budget_s)
            continue
        p = max(seen, key=lambda r: r["n"])
        warm = max(0.0, p.get("seconds", 0.0) - sum(p.get("ms_runs") or []) / 1000.0)
        total += predict_seconds(PointCost(n=p["n"], warm_s=warm, run_s=p["ms"] / 1000.0), n,
                                 _variants.get(impl).growth, cfg.repeats, cfg.time_budget_s)
    return total


def fitted_slopes(points: list[dict]) -> dict[str, dict[str, Any]]:
    """Per variant: {"time": p or None, "memory": p or None, "time_from": smallest n of the time fit}."""
    t, m = slopes(points, "ms"), slopes(points, "peak_bytes")
    return {impl: {"time": t[impl].p if t.get(impl) else None, "memory": m[impl].p if m.get(impl) else None,
                   "time_from": t[impl].n_min if t.get(impl) else None,
                   "memory_from": m[impl].n_min if m.get(impl) else None}
            for impl in t.keys() | m.keys()}


def noise_line(points: list[dict]) -> str:
    """The noise verdict as one sentence; '' when the timings look sound."""
    return noise_verdict(points).line()


def _sweep_job(config: dict):
    """Runs in a worker thread: stream the sweep as ("point" | "progress", dict) pairs."""
    from attn_explorer.cost.measure import Measurement, resolve_device, sweep

    cfg = SweepConfig(**config)
    try:
        cfg.device = resolve_device(cfg.device)
        cfg.validate()
    except ValueError as exc:  # no such device, or a setting out of range: one line for the user
        raise UserError(str(exc)) from None
    for item in sweep(cfg):
        yield ("point" if isinstance(item, Measurement) else "progress", item.to_dict())


def _qkv_job(model: Any, x: Any, run_kw: dict, layer: int, causal: bool, settings: dict,
             probe: Callable | None) -> dict:
    """Runs in a worker thread: q, k, v of one layer for the input on screen, then every variant on them."""
    if probe is None:
        from attn_explorer.api.probe import layer_qkv as probe
    from attn_explorer.cost.real import compare_on_qkv, window_for

    q, k, v = probe(model, x, layer, **run_kw)  # (H, N, d_k) each, as the run on screen saw them
    H, N, d_k = q.shape
    rows = compare_on_qkv(q, k, v, settings["impls"], window=settings["window"], causal=causal,
                          repeats=QKV_REPEATS)
    return {"layer": layer, "n": int(N), "heads": int(H), "d_k": int(d_k), "window": window_for(N, settings["window"]),
            "window_asked": settings["window"], "rows": [r.to_dict() for r in rows]}


class CostSweep(QObject):
    """One sweep at a time, and one q/k/v comparison at a time. `state` (a SessionState) is optional:
    without it there is no model to take q, k, v from. `probe(model, x, layer, **run_kw) -> (q, k, v)`
    defaults to attn_explorer.api.probe.layer_qkv."""

    point_measured = Signal(object)  # one Measurement dict, as it arrives
    progressed = Signal(float, str, str)  # fraction done, what runs next, time left ("about 40 s" or "")
    sweep_started = Signal()
    sweep_finished = Signal(str)  # "done", "cancelled" or "failed: <one line>"
    qkv_target_changed = Signal(str)  # what a q/k/v comparison would measure now; "" when no model is loaded
    qkv_measured = Signal(object)  # {"model", "layer", "n", "window", "rows": [QKVComparison dicts]}
    qkv_failed = Signal(str)  # one line
    qkv_cleared = Signal()  # the last comparison no longer describes the model, input or layer on screen

    def __init__(self, state: Any = None, probe: Callable | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self._probe = probe
        self._runner: Runner = state.runner if state is not None else Runner(self)
        self._running = False  # a sweep of ours is measuring (a cancelled one is not, even while its call ends)
        self._measuring_qkv = False
        self._qkv_key: tuple | None = None  # what the comparison in flight or on screen was taken from
        self.qkv_result: dict | None = None
        if state is not None:
            for signal in (state.model_loaded, state.attention_ready, state.selection_changed):
                signal.connect(self._state_changed)

    # --- the sweep ------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def busy(self) -> bool:
        """A sweep job is still in the pool (a cancelled one ends at its next call)."""
        return self._runner.lane_busy(SWEEP_LANE)

    def start(self, settings: dict) -> bool:
        """Start measuring; settings are SweepConfig fields. False if a sweep is already running."""
        if self._running:
            return False
        self._running = True
        self._runner.submit(SWEEP_LANE, Task(_sweep_job, (dict(settings),), on_yield=self._yielded,
                                             on_result=lambda _none: self._end("done"),
                                             on_error=lambda message: self._end(f"failed: {message}")),
                            uses_model=False)
        self.sweep_started.emit()
        return True

    def cancel(self) -> None:
        """Stop before the next call (a kernel cannot be interrupted halfway); nothing more arrives."""
        if self._running:
            self._runner.cancel_lane(SWEEP_LANE)
            self._end("cancelled")

    def _yielded(self, item: tuple[str, dict]) -> None:
        kind, data = item
        if kind == "point":  # what else ran during its n's timed rounds (a model run, a lesson's job): not its own time
            a, b = data.get("timed_from"), data.get("timed_to")
            beside = {} if a is None or b is None else self._runner.work(a, b, SHARED_SHARE, exclude=(SWEEP_LANE,))
            self.point_measured.emit({**data, "beside": beside})
        else:
            left = human_seconds(data["eta_s"])
            self.progressed.emit(data["done"] / max(1, data["total"]), data["message"], f"{left} left" if left else "")

    def _end(self, outcome: str) -> None:
        self._running = False
        self.sweep_finished.emit(outcome)

    # --- the model's own q, k, v ----------------------------------------------------------

    def _target(self) -> tuple[tuple, str] | None:
        s = self.state
        if s is None or not s.has_model or s.info is None:
            return None
        x, run_kw = s.run_input()
        if x is None:
            return None
        key = (s.info.name, id(s._model), x if isinstance(x, str) else id(x), s.layer, repr(sorted(run_kw.items())))
        n = f", {s.result.num_tokens} tokens" if s.result is not None else ""
        return key, f"{s.info.name}, layer {s.layer}, this input{n}"

    def qkv_target(self) -> str:
        """What a comparison would measure now ('' when there is no model)."""
        t = self._target()
        return t[1] if t else ""

    def measure_qkv(self, settings: dict) -> bool:
        """Measure settings["impls"] on the current layer's q, k, v for the current input."""
        t = self._target()
        if t is None or self.measuring_qkv:
            return False
        s = self.state
        x, run_kw = s.run_input()
        self._qkv_key = t[0]
        self._measuring_qkv = s.submit(_qkv_job, x, run_kw, s.layer, bool(s.info.causal), dict(settings), self._probe,
                                       key=QKV_LANE, on_result=self._qkv_done, on_error=self._qkv_error)
        return self._measuring_qkv

    @property
    def measuring_qkv(self) -> bool:
        """A comparison is on its way (one whose answer a load dropped is not, once its job ends)."""
        return self._measuring_qkv and self._runner.lane_busy(QKV_LANE)

    def _qkv_done(self, result: dict) -> None:
        self._measuring_qkv = False
        t = self._target()
        if t is None or t[0] != self._qkv_key:
            return  # the model, input or layer changed while it ran: it describes nothing on screen
        self.qkv_result = result | {"model": t[0][0]}
        self.qkv_measured.emit(self.qkv_result)

    def _qkv_error(self, message: str) -> None:
        self._measuring_qkv = False
        self.qkv_failed.emit(message)

    def _state_changed(self, *_: Any) -> None:
        t = self._target()
        if self.qkv_result is not None and (t is None or t[0] != self._qkv_key):
            self.qkv_result = None
            self.qkv_cleared.emit()
        self.qkv_target_changed.emit(t[1] if t else "")

    # --- shutting down --------------------------------------------------------------------

    def shutdown(self, wait_ms: int = 30000) -> None:
        """Stop this object's jobs and wait for them to finish (app exit, tests)."""
        import time

        from PySide6.QtCore import QCoreApplication

        self._running = self._measuring_qkv = False
        for lane in (SWEEP_LANE, QKV_LANE):
            self._runner.cancel_lane(lane)
        deadline = time.monotonic() + wait_ms / 1000
        while any(self._runner.lane_busy(k) for k in (SWEEP_LANE, QKV_LANE)) and time.monotonic() < deadline:
            QCoreApplication.processEvents()  # their finished signals are queued to this thread
            time.sleep(0.01)
