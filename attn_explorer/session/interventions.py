"""The Switch-off page's session (`InterventionSession`): heads switched off and scans, so `gui/` never imports
below `session/`.

Job functions, each run in a worker through `SessionState.submit(job, ..., key=...)` with the model as first
argument; a job that takes `progress` reports through it (and stops when the lane is cancelled: the
callback raises). What comes back is plain data: `Comparison` and `Scan` records of NumPy arrays and numbers.
analysis.interventions (and with it torch) is imported inside the jobs, so the window appears before torch loads.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

__all__ = ["COMPARE_LANE", "InterventionSession", "NO_CORRUPT", "SCAN_LANE", "SCANS", "ablation_job", "compare_job", "patching_job"]

# the scans the page offers: key -> (menu text, title of its result)
SCANS = {
    "ablation": ("Ablation scan", "Ablation scan: each head off in turn"),
    "patch-head": ("Patch per head", "Patching clean → corrupt, per head"),
    "patch-position": ("Patch per position", "Patching clean → corrupt, per (layer, position)"),
}


def _input(model, x, run_kw: dict):
    """x and the run's keywords as the analyses take them: a vision-language model's picture and prompt as the pair
    (image, text) (issue 26 B; SessionState.run_input gives the prompt as run_kw["text"])."""
    if getattr(model.info, "modality", None) != "image-text":
        return x, run_kw
    from attn_explorer.session.relevance import vlm_pair

    return vlm_pair(x, run_kw), {k: v for k, v in run_kw.items() if k != "text"}


def compare_job(model, x, run_kw: dict, ablate: dict, top: int = 8):
    """The clean run against the run with `ablate` ({(layer, head): "zero" | "mean"}) switched off (a
    Comparison)."""
    from attn_explorer.analysis.interventions import compare

    x, run_kw = _input(model, x, run_kw)
    return compare(model, x, ablate, top=top, **run_kw)


def ablation_job(model, x, run_kw: dict, how: str, target=None, foil=None, progress=None):
    """Each head switched off in turn (zero or mean): the L×H grid of the metric (a Scan)."""
    from attn_explorer.analysis.interventions import ablation_scan

    x, run_kw = _input(model, x, run_kw)
    return ablation_scan(model, x, how=how, target=target, foil=foil, progress=progress, **run_kw)


def patching_job(model, clean, corrupt, run_kw: dict, per: str, target=None, foil=None, progress=None):
    """Activation patching clean -> corrupt, per head or per (layer, position) (a Scan)."""
    from attn_explorer.analysis.interventions import patching_scan

    clean, run_kw = _input(model, clean, run_kw)
    return patching_scan(model, clean, corrupt, per=per, target=target, foil=foil, progress=progress, **run_kw)


COMPARE_LANE, SCAN_LANE = "interventions-compare", "interventions-scan"
NO_CORRUPT = "patching needs a corrupt text: type one with as many tokens as the input"


class InterventionSession(QObject):
    """The Switch-off page's session object: the heads switched off compared with the clean run, and scans
    (each head off in turn, or activation patching), each in its own worker lane, the newest request winning.

    It knows which input every answer belongs to, so a page never draws an answer for an input or heads that
    have changed since. Signals are past tense; every handler runs in the GUI thread."""

    compared = Signal(object)  # a Comparison for the heads and input asked last
    scan_progressed = Signal(float, str)  # fraction, message
    scanned = Signal(object)  # a Scan of the current input
    scan_dropped = Signal(str)  # a scan ended without an answer for this input: why ("cancelled", "input changed")
    failed = Signal(str, str)  # what ("compare" or "scan"), one line

    def __init__(self, state, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self._asked = None  # (input key, heads, how) of the comparison asked last
        self._scan_asked = None  # input key of the scan in flight

    @property
    def info(self):
        return self.state.info

    @property
    def ready(self) -> bool:
        """A model and a run of the input: there is something to switch off."""
        return self.state.info is not None and self.state.result is not None

    @property
    def scanning(self) -> bool:
        return self.state.job_busy(SCAN_LANE)

    def input_key(self):
        """What a result belongs to: the model, the input and the run options."""
        x, kw = self.state.run_input()
        info = self.state.info
        return (None if info is None else info.name, x if isinstance(x, str) else id(x), tuple(sorted(kw.items())))

    # ------------------------------------------------------------------ intent
    def compare(self, heads, how: str, top: int = 6) -> bool:
        """Measure the clean run against `heads` switched off (`how`: "zero" or "mean"); False: nothing to run."""
        if not self.ready:
            return False
        x, kw = self.state.run_input()
        key = (self.input_key(), frozenset(heads), how)
        self._asked = key
        ablate = {k: how for k in sorted(heads)}
        return bool(self.state.submit(compare_job, x, dict(kw), ablate, top, key=COMPARE_LANE,
                                      on_result=lambda c: self._compared(key, c),
                                      on_error=lambda m: self.failed.emit("compare", m)))

    def is_current(self, heads, how: str) -> bool:
        """The comparison asked last is for these heads and this input."""
        return self._asked == (self.input_key(), frozenset(heads), how)

    def scan(self, kind: str, how: str = "zero", target=None, foil=None) -> bool:
        """Each head switched off in turn (kind "ablation"); False: nothing to scan."""
        if not self.ready:
            return False
        x, kw = self.state.run_input()
        return self._submit_scan(ablation_job, x, dict(kw), how, target, foil)

    def patch(self, corrupt: str, per: str, target=None, foil=None) -> bool:
        """Activation patching clean (the input) -> `corrupt`, per "head" or per "position"."""
        if not self.ready:
            return False
        if not corrupt.strip():
            self.failed.emit("scan", NO_CORRUPT)
            return False
        x, kw = self.state.run_input()
        return self._submit_scan(patching_job, x, corrupt, dict(kw), per, target, foil)

    def cancel_scan(self, quiet: bool = False) -> None:
        """Stop the scan in flight (nothing of it arrives); unless quiet, `scan_dropped` says it was cancelled."""
        running = self.scanning
        self.state.cancel(SCAN_LANE)
        self._scan_asked = None
        if running and not quiet:
            self.scan_dropped.emit("cancelled")

    def cancel_compare(self) -> None:
        self.state.cancel(COMPARE_LANE)
        self._asked = None

    # ------------------------------------------------------------------ from the workers
    def _submit_scan(self, job, *args) -> bool:
        key = self.input_key()
        self._scan_asked = key
        return bool(self.state.submit(job, *args, key=SCAN_LANE, on_result=lambda s: self._scanned(key, s),
                                      on_error=lambda m: self.failed.emit("scan", m),
                                      on_progress=self.scan_progressed.emit))

    def _compared(self, key, c) -> None:
        if key == self._asked and key[0] == self.input_key():
            self.compared.emit(c)  # else the heads or the input changed meanwhile; the newer request answers

    def _scanned(self, key, scan) -> None:
        self._scan_asked = None
        if key != self.input_key():
            self.scan_dropped.emit("input changed")
            return
        self.scanned.emit(scan)
