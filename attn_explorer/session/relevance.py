"""What the relevance page may call from the analysis floor (analysis.relevance), so `gui/` never imports below
`session/`.

- `relevance_job(model, x, run_kw, method, target, progress)`: a job function, run by the page through
  `SessionState.submit(..., key=LANE)`; `progress` makes it report each layer (forward, then backward) and
  stop when the lane is cancelled.
- `target_kind(info)`, `target_hint(info)`: plain functions on ModelInfo, for the page's target box.
"""
from __future__ import annotations

from attn_explorer.analysis.relevance_methods import METHOD_TITLES, METHODS  # torch-free: read at window start

__all__ = ["LANE", "METHODS", "METHOD_TITLES", "relevance_job", "target_hint", "target_kind"]

LANE = "interventions-relevance"


def target_kind(info) -> str:
    """"image" (a class), "decoder" (the next token), "encoder" (a reference sentence) or "none"."""
    if info is None or info.encoder_decoder:
        return "none"
    if info.modality == "image":
        return "image"
    return "decoder" if info.causal else "encoder"


def target_hint(info) -> str:
    """The target box's placeholder: what it takes for this model."""
    return {
        "image": "class to explain (empty: the predicted class)",
        "decoder": "next token to explain, e.g. ' Paris' (empty: the most likely)",
        "encoder": "reference sentence: its similarity is explained",
        "none": "relevance is not supported for this model",
    }[target_kind(info)]


def vlm_pair(x, run_kw: dict):
    """A vision-language model's input as the analyses take it: (image, text), the prompt from the run's keywords
    (SessionState.run_input gives the picture as x and the prompt as run_kw["text"])."""
    return x if isinstance(x, tuple) else (x, run_kw.get("text") or "")


def relevance_job(model, x, run_kw: dict, method: str, target: str, progress=None):
    """The relevance of each token of x for the page's target (see analysis.relevance.explain). For an encoder
    `target` is the reference sentence; otherwise the class or the next token (empty: the model's own choice)."""
    from attn_explorer.analysis.relevance import explain  # torch: imported in the worker, not at window start

    kw = {k: run_kw[k] for k in ("dk_scale", "max_tokens", "image_size") if run_kw.get(k) is not None}
    if run_kw.get("dk_layers"):
        from attn_explorer.errors import UserError

        raise UserError("relevance uses one d_k scale for every layer: switch off 'only this layer' for the d_k slider")
    kind = target_kind(model.info)
    t = (target or "").strip() if kind != "decoder" else (target or "")
    if model.info.modality == "image-text":  # issue 26 B: the picture and the prompt together; rel.picture drawn
        return explain(model, vlm_pair(x, run_kw), method, target=t or None, progress=progress,
                       dk_scale=kw.get("dk_scale", 1.0))
    if kind == "encoder":
        return explain(model, x, method, reference=t, progress=progress, **kw)
    return explain(model, x, method, target=t or None, progress=progress, **kw)
