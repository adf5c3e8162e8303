"""What the Interventions page's head switch-off and scans may call, so `gui/` never imports below `session/`.

Job functions, each run in a worker through `SessionState.submit(job, ..., key=...)` with the model as first
argument; a job that takes `progress` reports through it (and stops when the lane is cancelled: the
callback raises). What comes back is plain data: `Comparison` and `Scan` records of NumPy arrays and numbers.
analysis.interventions (and with it torch) is imported inside the jobs, so the window appears before torch loads.
"""
from __future__ import annotations

__all__ = ["ablation_job", "compare_job", "patching_job", "SCANS"]

# the scans the page offers: key -> (menu text, title of its result)
SCANS = {
    "ablation": ("Ablation scan", "Ablation scan: each head off in turn"),
    "patch-head": ("Patch per head", "Patching clean → corrupt, per head"),
    "patch-position": ("Patch per position", "Patching clean → corrupt, per (layer, position)"),
}


def compare_job(model, x, run_kw: dict, ablate: dict, top: int = 8):
    """The clean run against the run with `ablate` ({(layer, head): "zero" | "mean"}) switched off (a
    Comparison)."""
    from attn_explorer.analysis.interventions import compare

    return compare(model, x, ablate, top=top, **run_kw)


def ablation_job(model, x, run_kw: dict, how: str, target=None, foil=None, progress=None):
    """Each head switched off in turn (zero or mean): the L×H grid of the metric (a Scan)."""
    from attn_explorer.analysis.interventions import ablation_scan

    return ablation_scan(model, x, how=how, target=target, foil=foil, progress=progress, **run_kw)


def patching_job(model, clean, corrupt, run_kw: dict, per: str, target=None, foil=None, progress=None):
    """Activation patching clean -> corrupt, per head or per (layer, position) (a Scan)."""
    from attn_explorer.analysis.interventions import patching_scan

    return patching_scan(model, clean, corrupt, per=per, target=target, foil=foil, progress=progress, **run_kw)
