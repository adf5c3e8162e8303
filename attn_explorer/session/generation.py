"""The Generate page's session object: one generation at a time on the session's model, streamed step
by step through `workers.launch` (a generator job; Stop is the worker's `quit()`).

It keeps what the page draws, already reduced to NumPy arrays: each step's attention row, the
next-token probabilities, and the share of attention on the first token (the "attention sink"),
averaged over every layer and head. A new model or a new generation clears it all at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Signal

SUGGESTED_MODEL = "smollm2-135m"


@dataclass
class PromptInfo:
    """The prompt as the model reads it (after the chat template), sent before the first step."""

    text: str
    tokens: list[str]
    ids: list[int]


def generation_job(model: Any, prompt: str, max_new_tokens: int, temperature: float, top_k: int | None,
                   chat: bool, seed: int | None):
    """Runs in a worker: yields a PromptInfo, then every api.generate.Step. Returns the step count."""
    from attn_explorer.session.jobs import configure_torch

    configure_torch()
    gen = model.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, chat=chat,
                         seed=seed)
    yield PromptInfo(gen.prompt_text, list(gen.prompt_tokens), list(gen.prompt_ids))
    count = 0
    for step in gen:
        count += 1
        yield step
    return count


class GenerationSession(QObject):
    """State of the Generate page. Signals are past tense; every handler runs in the GUI thread."""

    started = Signal()  # a generation began: everything shown before is cleared
    prompt_ready = Signal(object)  # PromptInfo
    step_arrived = Signal(object)  # api.generate.Step
    finished = Signal(str)  # "done", "stopped" or "failed: <one line>"
    cleared = Signal()  # the model changed: nothing generated is valid any more

    def __init__(self, state: Any, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self._worker: Any = None
        self.prompt: PromptInfo | None = None
        self.steps: list = []
        self.sink: list[float] = []  # per step: mean over layers and heads of the weight on token 0
        self.temperature = 0.0  # of the generation shown (the slider may have moved since)
        state.model_loaded.connect(lambda _info: self.clear())

    # ------------------------------------------------------------------ what the page asks
    @property
    def info(self):
        return self.state.info

    @property
    def can_generate(self) -> bool:
        """The open model writes text one token at a time (a decoder)."""
        i = self.state.info
        return i is not None and i.modality == "text" and bool(i.causal) and self.state.has_model

    @property
    def running(self) -> bool:
        return self._worker is not None

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.steps)

    def newest_rows(self) -> np.ndarray | None:
        """(L·H, n): the newest token's attention row in every head (layer-major), over every token so far;
        one column more with each new token."""
        if not self.steps:
            return None
        a = self.steps[-1].attention
        return a.reshape(a.shape[0] * a.shape[1], a.shape[2])

    def head_rows(self, layer: int, head: int) -> np.ndarray | None:
        """(steps, n): one head's row of every step, padded with NaN on the right (a growing triangle)."""
        if not self.steps:
            return None
        n = self.steps[-1].attention.shape[-1]
        out = np.full((len(self.steps), n), np.nan, dtype=np.float32)
        for i, s in enumerate(self.steps):
            row = s.attention[layer, head]
            out[i, : row.shape[0]] = row
        return out

    # ------------------------------------------------------------------ intent
    def start(self, prompt: str, chat: bool = False, temperature: float = 0.0, max_new_tokens: int = 32,
              top_k: int | None = None, seed: int | None = None) -> bool:
        """Begin a new generation (stopping one in flight). False when there is no decoder to run."""
        if not self.can_generate:
            return False
        self.stop(report=False)
        self._reset()
        self.temperature = float(temperature)
        self.started.emit()
        worker = self.state.submit(generation_job, prompt, max_new_tokens, temperature, top_k, chat, seed,
                                   on_yield=self._on_yield, on_result=lambda _n: self._end("done"),
                                   on_error=self._on_error)
        self._worker = worker
        return worker is not None

    def stop(self, report: bool = True) -> None:
        """Stop the generation in flight: steps already on their way are dropped."""
        if self._worker is None:
            return
        self._worker.quit()
        self._worker = None
        if report:
            self.finished.emit("stopped")

    def clear(self) -> None:
        self.stop(report=False)
        self._reset()
        self.cleared.emit()

    # ------------------------------------------------------------------ from the worker
    def _reset(self) -> None:
        self.prompt, self.steps, self.sink = None, [], []

    def _on_yield(self, item: Any) -> None:
        if isinstance(item, PromptInfo):
            self.prompt = item
            self.prompt_ready.emit(item)
            return
        self.steps.append(item)
        self.sink.append(float(item.attention[:, :, 0].mean()))
        self.step_arrived.emit(item)

    def _on_error(self, message: str) -> None:
        self._worker = None
        self.state.error_raised.emit(message)
        self.finished.emit(f"failed: {message}")

    def _end(self, how: str) -> None:
        self._worker = None
        self.finished.emit(how)
