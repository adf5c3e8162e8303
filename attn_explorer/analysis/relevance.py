"""Gradient relevance: which input tokens (or image patches) a model's output depends on.

Two gradient methods and two attention-only baselines, each giving one number per input token:

- `gradient_rollout`: Chefer, Gur & Wolf 2021 ("Generic Attention-model Explainability"). Every
  layer's maps A (H, N, N) are weighted by the gradient of the target score: Ā = mean_h(relu(∂y/∂A ⊙ A)),
  and rolled up from the identity, R ← R + Ā·R, first layer first. The relevance of token j is row i of
  R − I (the identity start taken off: what the layers added) for the token(s) i that the score reads.
- `attnlrp`: a subset of AttnLRP (Achtibat et al. 2024, ICML), as gradient × input at the input of the
  first block, Σ_d x_jd · g_jd, with the backward rules of core.explain: the uniform rule on q·kᵀ, A·V and
  the gated MLP's product, the identity rule on LayerNorm / RMSNorm and on the MLP activations, the
  softmax's own gradient (AttnLRP's softmax rule in this form), plain gradients through linear layers.
  Signed: negative relevance speaks against the target.
- `rollout`: attention rollout (Abnar & Zuidema 2020), analysis.rollout, heads averaged: no gradient.
- `attention`: the last layer's raw attention from the token(s) the score reads, averaged over heads.

What is explained (the score y), by the kind of model:
- image classifier: the class's logit (before the softmax), the predicted class unless one is given;
  the rows read are [CLS] (and DeiT's [DIST], which its head averages with [CLS]);
- decoder: the log-probability of the target token after the text (gradient rollout), or its logit
  (AttnLRP, which conserves a score, not a log-probability); the row read is the last token;
- encoder: the cosine similarity between the text's sentence embedding (the mean of the last hidden
  states over the tokens, as sentence-transformers pools MiniLM) and a reference sentence's; every row.

The forward pass here records autograd (the maps stay in the graph: core.attention's explicit path);
gradients come from torch.autograd.grad, so no parameter's .grad is touched.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from attn_explorer.analysis.relevance_methods import METHOD_TITLES, METHODS
from attn_explorer.api.model import Model
from attn_explorer.api.vlm import analysis as vlm_analysis
from attn_explorer.api.vlm import place_on_picture
from attn_explorer.errors import UserError

__all__ = ["METHODS", "METHOD_TITLES", "Relevance", "explain", "patch_relevance"]


@dataclass
class Relevance:
    """One input's relevance per token for one score (NumPy and plain data: it can cross into the GUI)."""

    method: str  # one of METHODS
    scores: np.ndarray  # float32 (N,): each input token's relevance (attnlrp: signed)
    tokens: list[str]
    special: np.ndarray  # bool (N,)
    target: str  # what was explained, in words ('logit of class "7"', 'log p(" Paris")', ...)
    value: float  # the score's value on this input
    rows: list[int]  # the query rows the score reads
    grid: tuple[int, int] | None = None  # image models: the patch grid
    patch_offset: int = 0  # image models: patches are tokens[patch_offset:]
    image: np.ndarray | None = None  # image models: uint8 (H, W, 3), the pixels seen
    notes: list[str] = field(default_factory=list)
    # vision-language models (analysis.relevance_vlm): each image token's place, as RunResult has them
    image_token_positions: np.ndarray | None = None  # int32 (n, 5): token, tile, row, col, merge
    image_tiles: tuple[int, int] | None = None
    picture: np.ndarray | None = None  # float32 (rows, cols) in patch units: the image tokens' relevance in place


def check_method(method) -> str:
    m = str(method).strip().lower().replace("-", "_").replace(" ", "_")
    if m not in METHODS:
        raise UserError(f"unknown relevance method {method!r}: choose from {', '.join(METHODS)}")
    return m


# ---- the rules on tensors --------------------------------------------------------------------------------

def gradient_rollout(probs: list[torch.Tensor], grads: list[torch.Tensor]) -> torch.Tensor:
    """Chefer et al. 2021's rule over layers: probs and grads (B, H, N, N) per layer, first layer first ->
    R (B, N, N), starting from the identity: R ← R + mean_h(relu(grad ⊙ A)) · R."""
    B, _, N, _ = probs[0].shape
    R = torch.eye(N, dtype=probs[0].dtype, device=probs[0].device).expand(B, N, N)
    for A, G in zip(probs, grads):
        a_bar = (G * A).clamp(min=0).mean(1)  # (B, N, N)
        R = R + a_bar @ R
    return R


def plain_rollout(probs: list[torch.Tensor]) -> torch.Tensor:
    """Abnar & Zuidema's rollout on (B, H, N, N) maps, heads averaged: R = Π (0.5·Ā + 0.5·I), rows renormalised."""
    B, _, N, _ = probs[0].shape
    eye = torch.eye(N, dtype=probs[0].dtype, device=probs[0].device)
    R = eye.expand(B, N, N)
    for A in probs:
        step = 0.5 * A.mean(1) + 0.5 * eye
        R = (step / step.sum(-1, keepdim=True).clamp_min(1e-12)) @ R
    return R


def read_rows(M: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """(B, N, N) -> (B, N): the mean of the rows the score reads."""
    return M[:, rows].mean(1)


# ---- one forward and backward pass ------------------------------------------------------------------------

def num_layers(module) -> int:
    from attn_explorer.core.blocks import BlockStack

    own = getattr(module, "blocks", None)  # a vision-language model's decoder (its tower has a stack too)
    stack = own if isinstance(own, BlockStack) else next((m for m in module.modules() if isinstance(m, BlockStack)),
                                                         None)
    if stack is None:
        raise UserError("this model has no attention layers to explain")
    return len(stack.layers)


def token_relevance(model: Model, inputs: dict, score: Callable, method: str, rows: list[int], dk_scale: float = 1.0,
                    progress: Callable[[float, str], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Relevance (B, N) float32 of each input token for score(out) (B,), and the scores (B,).

    One forward pass (Model.trace) with autograd (every layer's hook_pattern kept in the graph, and block 0's
    hook_resid_pre for AttnLRP) and, for the gradient methods,
    one backward pass. Each sample's score depends on its own input only, so the gradient of the sum
    is each sample's own: a batch gives what each input gives alone. progress(fraction, message) is
    called once per layer each way (a cancelled job stops there)."""
    method = check_method(method)
    from attn_explorer.core.explain import lrp_rules

    L = num_layers(model.module)
    report = progress or (lambda f, m: None)
    ticks = {f"blocks.{i}.attn.hook_z": _forward_tick(report, i, L) for i in range(L)}
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(L)] + ["blocks.0.hook_resid_pre"]
    grads_needed = method in ("gradient_rollout", "attnlrp")
    if grads_needed and not any(p.requires_grad for p in model.module.parameters()):
        raise UserError("this model's weights are frozen (requires_grad off): gradient relevance needs autograd")
    mode = torch.enable_grad() if grads_needed else torch.no_grad()
    with mode, (lrp_rules() if method == "attnlrp" else nullcontext()), vlm_analysis("relevance"):
        t = model.trace(inputs, ticks, names, dk_scale=dk_scale, grad=grads_needed)
        y = score(t.out)  # (B,)
    probs = [t.cache[f"blocks.{i}.attn.hook_pattern"] for i in range(L)]
    if method == "attention":
        rel = probs[-1].detach().mean(1)[:, rows].mean(1)
    elif method == "rollout":
        rel = read_rows(plain_rollout([p.detach().float() for p in probs]), rows)
    elif method == "gradient_rollout":
        for i, p in enumerate(probs):
            p.register_hook(_backward_tick(report, L - 1 - i, L))
        grads = torch.autograd.grad(y.sum(), probs)
        R = gradient_rollout([p.detach().float() for p in probs], [g.float() for g in grads])
        rel = read_rows(R - torch.eye(R.shape[-1], dtype=R.dtype, device=R.device), rows)  # what the layers added
    else:
        for i, p in enumerate(probs):
            p.register_hook(_backward_tick(report, L - 1 - i, L))
        x0 = t.cache["blocks.0.hook_resid_pre"]
        (g,) = torch.autograd.grad(y.sum(), x0)
        rel = (x0.detach().float() * g.float()).sum(-1)  # (B, N): Σ_d x ⊙ ∂y/∂x
    report(1.0, "done")
    return rel.detach().float().cpu().numpy(), y.detach().float().cpu().numpy()


def _forward_tick(report, i: int, L: int):
    def hook(z, name):  # on blocks.{i}.attn.hook_z: reports, changes nothing
        report(0.5 * i / L, f"forward: layer {i + 1} of {L}")

    return hook


def _backward_tick(report, done: int, L: int):
    def hook(grad):
        report(0.5 + 0.5 * done / L, f"backward: layer {L - done} of {L}")
        return None

    return hook


# ---- scores -----------------------------------------------------------------------------------------------

def class_logit(classes: torch.Tensor | None, chosen: dict | None = None) -> Callable:
    """Score: each sample's logit of its class (classes (B,) long; None: the predicted class, chosen from this
    very forward pass and left in chosen["index"], so no pass is spent on choosing it)."""
    def score(out):
        c = out.logits.detach().argmax(-1) if classes is None else classes.view(-1).to(out.logits.device)
        if chosen is not None:
            chosen["index"] = c
        return out.logits.gather(1, c.view(-1, 1)).squeeze(1)

    return score


def next_token_score(module, token_id: int | None, log_prob: bool, chosen: dict | None = None) -> Callable:
    """Score: the target token's log-probability (or logit) after the last input token (token_id None: the
    most likely next token of this forward pass, left in chosen["index"])."""
    def score(out):
        logits = module.logits(out.hidden[:, -1]).float()
        t = logits.detach().argmax(-1) if token_id is None else torch.full((logits.shape[0],), int(token_id),
                                                                          device=logits.device)
        if chosen is not None:
            chosen["index"] = t
        return (F.log_softmax(logits, -1) if log_prob else logits).gather(1, t.view(-1, 1)).squeeze(1)

    return score


def mean_pooled(hidden: torch.Tensor) -> torch.Tensor:
    """(B, N, D) -> (B, D): the sentence embedding, the mean of the tokens' last hidden states."""
    return hidden.float().mean(1)


def similarity_score(reference: torch.Tensor) -> Callable:
    """Score: the cosine similarity of the sentence embedding to reference (D,)."""
    return lambda out: F.cosine_similarity(mean_pooled(out.hidden), reference[None].float(), dim=-1)


# ---- a whole explanation for one input of an api Model -------------------------------------------------------

def model_kind(model: Model) -> str:
    """"image", "decoder" or "encoder"; a UserError for what cannot be explained here."""
    info, module = model.info, model.module
    if info.encoder_decoder:
        raise UserError(f"relevance is not supported yet for encoder-decoders ({info.name})")
    if info.modality == "image":
        if getattr(module, "heads", None) is None:
            raise UserError(f"{info.name} has no classifier head: an image's relevance needs a class to explain")
        return "image"
    if getattr(module, "causal", False):
        if not (hasattr(module, "logits") and getattr(module, "can_generate", False)):
            raise UserError(f"{info.name} has no LM head: a decoder's relevance needs next-token logits")
        return "decoder"
    return "encoder"


def token_id(model: Model, target: str) -> int:
    """The one token id of target (a decoder's next token); a UserError when it is not exactly one token."""
    if model.tokenizer is None:
        raise UserError(f"{model.info.name} has no tokenizer to read the target token with")
    return model.tokenizer.single_token_id(target)


def class_index(model: Model, target) -> int:
    """A class given by its label or its number; a UserError for neither."""
    labels = model.labels or {}
    t = str(target).strip()
    for i, name in labels.items():
        if name == t:
            return int(i)
    n = int(model.module.cfg.num_labels)
    if t.isdigit() and int(t) < n:
        return int(t)
    known = ", ".join(labels[i] for i in sorted(labels)[:12]) if labels else f"0..{n - 1}"
    raise UserError(f"unknown class {target!r}: use one of {known}")


def explain(model: Model, x, method: str = "gradient_rollout", target=None, reference: str | None = None,
            dk_scale: float = 1.0, max_tokens: int | None = None, image_size: int | None = None,
            progress: Callable[[float, str], None] | None = None) -> Relevance:
    """The relevance of each token of x (text, an image, or a vision-language model's (image, text) pair: see
    analysis.relevance_vlm) for one score of `model` (an api Model).

    target: image models, a class label or number (default: the predicted class); decoders, one token of
    text (default: the most likely next token). reference: encoders, the sentence to compare with (needed)."""
    method = check_method(method)
    if model.info.modality == "image-text":  # x: (image, text); relevance over image and text tokens
        return explain_picture(model, x, method, target, dk_scale, progress)
    kind = model_kind(model)
    dk_scale, _ = model.check_dk(dk_scale, None)
    prep = model.prepare(x, max_tokens=max_tokens, image_size=image_size)
    if kind == "image":
        return _explain_image(model, prep, method, target, dk_scale, progress)
    tokens, special = list(prep.tokens), np.asarray(prep.special, dtype=bool)
    chosen: dict = {}
    if kind == "decoder":
        tid = None if target in (None, "") else token_id(model, target)
        log_prob = method != "attnlrp"
        score, rows = next_token_score(model.module, tid, log_prob, chosen), [len(tokens) - 1]
    else:
        if reference is None or not str(reference).strip():
            raise UserError("an encoder's relevance explains the similarity to a reference sentence: give one")
        ref = model.prepare(str(reference), max_tokens=max_tokens)
        emb = mean_pooled(model.trace(ref, dk_scale=dk_scale).out.hidden)[0].detach().clone()
        what = f'cosine similarity to "{_short(reference)}"'
        score, rows = similarity_score(emb), list(range(len(tokens)))
    rel, y = token_relevance(model, prep.inputs, score, method, rows, dk_scale, progress)
    if kind == "decoder":
        shown = model.tokenizer.display([int(chosen["index"][0])])[0]
        what = f'log p("{shown}" next)' if log_prob else f'logit of "{shown}" next'
    return Relevance(method, rel[0], tokens, special, what, float(y[0]), rows, notes=list(prep.notes))


def _explain_image(model: Model, prep, method, target, dk_scale, progress) -> Relevance:
    cls = None if target in (None, "") else torch.tensor([class_index(model, target)])
    extra = model.extra_tokens()
    p = model.info.patch_size
    r, c = (int(s) // p for s in prep.inputs["pixels"].shape[-2:])  # the patch grid
    rows = list(range(min(len(extra), int(getattr(model.module.cfg, "classifier_tokens", 1))))) or \
        list(range(r * c))  # SigLIP (no [CLS]): every token
    chosen: dict = {}
    rel, y = token_relevance(model, prep.inputs, class_logit(cls, chosen), method, rows, dk_scale, progress)
    index = int(chosen["index"][0])
    label = model.labels.get(index, str(index))
    tokens = extra + [f"r{i}c{j}" for i in range(r) for j in range(c)]
    special = np.asarray([True] * len(extra) + [False] * (r * c))
    return Relevance(method, rel[0], tokens, special, f'logit of class "{label}"', float(y[0]), rows, grid=(r, c),
                     patch_offset=len(extra), image=prep.image, notes=list(prep.notes))


def _short(text: str, n: int = 40) -> str:
    t = " ".join(str(text).split())
    return t if len(t) <= n else t[: n - 1] + "…"


def patch_relevance(rel: Relevance) -> np.ndarray:
    """An image's relevance over its patches as the (rows, cols) grid (the extra tokens left out)."""
    if rel.grid is None:
        raise UserError("this relevance is over text tokens, not image patches")
    return rel.scores[rel.patch_offset:].reshape(rel.grid)


def export_arrays(model: Model, x, run_kw: dict, target: str | None = None) -> dict[str, np.ndarray]:
    """Every method's relevance for `export --analysis relevance`: relevance (M, N) float32, one row per method in
    the order of relevance_methods (M,), with relevance_targets (M,) saying what each row explains and
    relevance_values (M,) the score's value. target: the class (images), the next token (decoders) or the
    reference sentence (encoders, needed)."""
    kw = {k: v for k, v in run_kw.items() if k in ("dk_scale", "max_tokens", "image_size") and v is not None}
    kind = model_kind(model)
    if kind == "encoder":
        if target is None or not str(target).strip():
            raise UserError("--analysis relevance on an encoder explains the similarity to a reference sentence: "
                            "give it with --relevance-target")
        runs = [explain(model, x, m, reference=target, **kw) for m in METHODS]
    else:
        runs = [explain(model, x, m, target=target or None, **kw) for m in METHODS]
    return {
        "relevance": np.stack([r.scores for r in runs]).astype(np.float32),
        "relevance_methods": np.asarray(METHODS, dtype=np.str_),
        "relevance_targets": np.asarray([r.target for r in runs], dtype=np.str_),
        "relevance_values": np.asarray([r.value for r in runs], dtype=np.float64),
    }


# ---- vision-language models (see analysis.relevance_vlm's docstring) -----------------------------------------
def explain_picture(model: Model, x, method: str = "gradient_rollout", target=None, dk_scale: float = 1.0,
                    progress: Callable[[float, str], None] | None = None) -> Relevance:
    """The relevance of each token of x = (image, text) for the decoder's next token (target: one token of text;
    None: the most likely one). Relevance.image_token_positions places the image tokens; Relevance.picture holds
    them in place (picture_relevance)."""
    method = check_method(method)
    name = model.info.family
    if not getattr(model.module, "can_generate", False):
        raise UserError(f"{name}: this checkpoint has no LM head: relevance explains a next token's logits")
    if method == "attnlrp" and getattr(model.module.cfg, "kind", "") == "qwen3_vl":
        raise UserError(f"{name}: AttnLRP is not offered: DeepStack adds image features after the decoder's first "
                        "layers, which gradient × input at the first block leaves out; use gradient_rollout")
    dk_scale, _ = model.check_dk(dk_scale, None)
    prep = model.prepare(x)
    tid = None if target in (None, "") else token_id(model, target)
    log_prob = method != "attnlrp"
    chosen: dict = {}
    rows = [len(prep.tokens) - 1]
    rel, y = token_relevance(model, prep.inputs, next_token_score(model.module, tid, log_prob, chosen), method, rows,
                             dk_scale, progress)
    shown = model.tokenizer.display([int(chosen["index"][0])])[0]
    what = f'log p("{shown}" next)' if log_prob else f'logit of "{shown}" next'
    out = Relevance(method, rel[0], list(prep.tokens), np.asarray(prep.special, dtype=bool), what, float(y[0]), rows,
                    image=prep.image, notes=list(prep.notes), image_token_positions=prep.image_token_positions,
                    image_tiles=prep.image_tiles)
    out.picture = picture_relevance(out)  # plain NumPy, ready for a page to draw over rel.image
    return out


def picture_relevance(rel: Relevance) -> np.ndarray:
    """A vision-language relevance's image tokens on the picture: float32 (rows, cols) in patch units (the tiles
    assembled as the picture was cut; Idefics3's global view left out: `place_on_picture(...).global_view`)."""
    if rel.image_token_positions is None:
        raise UserError("this relevance has no image tokens (explain a vision-language model on a picture and a "
                        "prompt)")
    return place_on_picture(rel.scores, rel.image_token_positions, rel.image_tiles).picture
