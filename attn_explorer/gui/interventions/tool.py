"""`ToolPage`: the frame (widgets.page.PageFrame) of the logit-lens, contribution-graph and why-this-head pages,
with their one worker job at a time on screen: progress, Cancel, and a message in the content's place.

They read decoders only: `usable()` says so on the page for any other model.
"""
from __future__ import annotations

from PySide6.QtWidgets import QWidget

from attn_explorer.gui.widgets.page import PageFrame
from attn_explorer.gui.widgets.tokens import token_text
from attn_explorer.session.state import SessionState

NOT_A_DECODER = ("{what} needs a decoder with next-token logits (SmolLM2, Gemma 3, GPT-2); {name} is not one. "
                 "Pick a decoder in the Model box.")


def visible(token: str, width: int = 10) -> str:
    """A token as a cell can show it: white space drawn (␣ space, ↵ newline, ⇥ tab, ∅ nothing), cut to width."""
    return token_text(token, width)


def is_decoder(info) -> bool:
    return info is not None and info.modality == "text" and info.causal and info.can_generate


class ToolPage(PageFrame):
    """A decoder tool's page: the shared frame, one worker job at a time on its progress line."""

    WHAT = "This page"  # for the not-a-decoder message
    follow_up_lanes: tuple = ()  # lanes of jobs that hang off the main one (cancelled with it)
    AGAIN = "Press Run to measure again."  # what brings the numbers back after a cancel
    MEASURED = "Measured: drawing…"  # the page's line once the bar reaches 100 % (the result is on its way)

    def __init__(self, state: SessionState, content: QWidget, parent: QWidget | None = None):
        super().__init__(state, content, parent, message="Load a decoder to use this page.", fill_height=260,
                         rich=True, mono_readout=False)
        self.unused_note(hide="every token writes into the residual stream",
                         log="the numbers are logits, probabilities and shares")
        self._lane: str | None = None  # the lane of the job on screen
        self.done_for = None  # the RunResult the page's numbers belong to
        state.attention_ready.connect(lambda *_: self.refresh())
        state.model_loading.connect(self._loading)
        state.model_loaded.connect(lambda *_: self._forget())
        state.input_cleared.connect(lambda: self._cleared())

    def finish_bar(self) -> None:
        self.control_row.addStretch(1)

    # --------------------------------------------------------------------------- jobs
    def start(self, job, *args, key: str, on_result, message: str) -> bool:
        """Run job(model, *args) in lane `key`, with progress and Cancel; False when there is no model."""
        self._lane = key
        self.progress.start("", message + " %p%")
        started = self.state.submit(job, *args, key=key, on_result=lambda v: self._arrived(key, on_result, v),
                                    on_error=lambda msg: self._failed(key, msg), on_progress=self._progressed)
        if not started:
            self.progress.finish()
        return started

    def _progressed(self, fraction: float, _message: str) -> None:
        self.progress.advance(fraction)
        if fraction >= 1 and self.stack.currentWidget() is self.stack.placeholder:
            self.stack.show_message(self.MEASURED)  # the bar says 100 %: the line no longer says "reading"

    def _arrived(self, key: str, on_result, value) -> None:
        self._job_ended(key)
        on_result(value)

    def _job_ended(self, key: str) -> None:
        if key == self._lane:
            self.progress.finish()
            self._lane = None

    def cancel(self) -> None:
        """Stop the job on screen; the page says so (the last numbers are gone with the input they were for)."""
        if self._lane is None:
            return
        for lane in self.follow_up_lanes:
            self.state.cancel(lane)
        self.state.cancel(self._lane)
        self._job_ended(self._lane)
        self.done_for = None
        self.stack.show_message(f"Cancelled. {self.AGAIN}")
        self.caption.setText("")
        self.readout.setText("")

    def _failed(self, key: str, message: str) -> None:
        """The job failed: its one line goes to the banner, and the page points there."""
        self._job_ended(key)
        self.done_for = None
        self.show_failure(message)

    # --------------------------------------------------------------------------- what to draw
    def usable(self):
        """The result to measure now, or None (with the page saying why): no decoder, no input, hidden."""
        info = self.state.info
        if info is not None and not is_decoder(info):
            self.done_for = None
            self.stack.show_message(NOT_A_DECODER.format(what=self.WHAT, name=info.name))
            self.caption.setText("")
            self.readout.setText("")
            return None
        return self.result_to_draw()

    def _forget(self) -> None:
        self.done_for = None

    def _loading(self, src: str) -> None:
        """Another model is coming: this page's numbers belong to the old one, so they go."""
        self._cleared(f"Loading {src or 'the model'}…")

    def _cleared(self, message: str = "Type or paste some text.") -> None:
        """The input is gone (or the model is being replaced): stop the job, drop the numbers, say why."""
        for lane in self.follow_up_lanes:
            self.state.cancel(lane)
        if self._lane is not None:
            self.state.cancel(self._lane)
            self._job_ended(self._lane)
        self.done_for = None
        self.caption.setText("")
        self.readout.setText("")
        self.stack.show_message(message)
