"""What the run in flight is doing, in words (issue 24 D): model, tokens, layer k of L, elapsed and an estimate.

The forward reports each finished layer from its own layer loop (core.progress, through jobs.run_job's
progress callback); `RunWatch` turns those reports into the line the window shows while the run lasts, and
says whether the maps on screen are the previous input's. Plain Python: the GUI reads it, nothing here
touches a tensor.
"""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class RunWatch:
    """The run in flight: started when the runner starts it, updated per layer, ended with its result."""

    model: str = ""
    layers: int = 0
    started: float = 0.0  # perf_counter when the job started
    layer: int = 0  # layers done
    tokens: int = 0  # tokens the forward runs (after a reused prefix: only the new ones)
    active: bool = False

    def start(self, model: str, layers: int) -> None:
        self.model, self.layers, self.layer, self.tokens = model, int(layers), 0, 0
        self.started, self.active = time.perf_counter(), True

    def update(self, done: int, total: int, tokens: int) -> None:
        self.layer, self.layers, self.tokens = int(done), int(total), int(tokens)

    def end(self) -> None:
        self.active = False

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started if self.active else 0.0

    @property
    def left(self) -> float | None:
        """Seconds still to go, from the time per layer so far (None before the first layer)."""
        if not self.active or self.layer <= 0 or not self.layers:
            return None
        return self.elapsed / self.layer * max(0, self.layers - self.layer)

    def status(self) -> dict | None:
        """{"model", "tokens", "layer", "layers", "elapsed_s", "left_s"} of the run in flight, or None."""
        if not self.active:
            return None
        return {"model": self.model, "tokens": self.tokens, "layer": self.layer, "layers": self.layers,
                "elapsed_s": self.elapsed, "left_s": self.left}

    def line(self) -> str:
        """"running gemma3-270m: 28,252 tokens, layer 7 of 18 · 41 s, about 65 s left" ("" when idle)."""
        if not self.active:
            return ""
        where = (f"{self.tokens:,} tokens, layer {self.layer} of {self.layers}" if self.layer
                 else "starting")
        left = self.left
        eta = f", about {_seconds(left)} left" if left is not None else ""
        return f"running {self.model}: {where} · {_seconds(self.elapsed)}{eta}"


def _seconds(s: float) -> str:
    s = max(0.0, float(s))
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{int(s // 60)} min {int(s % 60):02d} s"
