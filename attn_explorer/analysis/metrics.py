"""How an intervention is measured: the metric that fits the model (analysis.interventions runs them).

  decoders:          the next token's log-probability of a target token, or the logit difference target − foil;
  text encoders:     the cosine similarity of the sentence embedding (mean-pooled last hidden state over the real
                     tokens, as sentence-transformers computes it for MiniLM) with the clean run's;
  image classifiers: the class probability (tiny-vit-digits);
  image backbones:   the cosine similarity of the [CLS] embedding with the clean run's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_explorer.api.model import Model
from attn_explorer.errors import UserError


@dataclass
class Metric:
    """What an intervention is measured by; calling it on a forward's output gives one value per copy (B,)."""

    kind: str  # "logprob", "logit_diff", "cosine" (text: mean-pooled; image: [CLS]), "class_prob"
    label: str  # for people: "log p(' Mary')", "logit(' Mary') − logit(' John')", ...
    target: int | None = None  # token id (decoders) or class index (classifiers)
    foil: int | None = None  # logit_diff: the other token
    reference: torch.Tensor | None = None  # cosine: the clean run's embedding (D,)
    pool: str = "mean"  # cosine: "mean" over the tokens (sentence-transformers) or "cls" (image backbones)

    def __call__(self, module, out) -> torch.Tensor:
        with torch.inference_mode():
            return self._measure(module, out)

    def _measure(self, module, out) -> torch.Tensor:
        if self.kind in ("logprob", "logit_diff"):
            logits = module.logits(out.hidden[:, -1]).float()  # (B, vocab): the next token after the input
            if self.kind == "logit_diff":
                return logits[:, self.target] - logits[:, self.foil]
            return torch.log_softmax(logits, dim=-1)[:, self.target]
        if self.kind == "class_prob":
            return torch.softmax(out.logits.float(), dim=-1)[:, self.target]
        emb = embedding(out.hidden, self.pool)
        return torch.nn.functional.cosine_similarity(emb, self.reference[None].to(emb), dim=-1)


def embedding(hidden: torch.Tensor, pool: str) -> torch.Tensor:
    """(B, N, D) last hidden state -> (B, D): mean over the tokens (every token is real here: one input,
    no padding, as sentence-transformers' mean pooling with attention mask 1), or the first token ([CLS])."""
    return hidden[:, 0].float() if pool == "cls" else hidden.float().mean(dim=1)


def is_decoder(model: Model) -> bool:
    """A decoder with next-token logits (core Llama and GPT-2 families: `logits(hidden)`)."""
    return bool(model.info.causal and model.info.can_generate and hasattr(model.module, "logits"))


def is_classifier(model: Model) -> bool:
    return model.info.modality == "image" and getattr(getattr(model.module, "cfg", None), "num_labels", 0) > 0


def token_id(model: Model, token: str) -> int:
    """The id of `token`, which must be one token of the model's vocabulary (" Mary", with its space)."""
    if model.tokenizer is None:
        raise UserError(f"{model.info.name} has no tokenizer: give the target as text it can read")
    return model.tokenizer.single_token_id(token)


def class_index(model: Model, target) -> int:
    """A classifier's class: its label ("7") or its index."""
    labels = {str(v): int(k) for k, v in model.labels.items()}
    n = model.module.cfg.num_labels
    if str(target) in labels:
        return labels[str(target)]
    try:
        i = int(target)
    except (TypeError, ValueError):
        i = -1
    if not 0 <= i < n:
        raise UserError(f"no class {target!r}: {model.info.name} has classes 0..{n - 1}")
    return i


def make_metric(model: Model, prep, clean_out, target=None, foil=None) -> Metric:
    """The metric that fits the model, for a prepared input whose clean output is clean_out. Decoders
    without a target measure the clean run's most likely next token; classifiers its top class."""
    if model.info.encoder_decoder:
        raise UserError("interventions are not supported yet for encoder-decoders (BART)")
    if is_decoder(model):
        with torch.inference_mode():
            logits = model.module.logits(clean_out.hidden[:, -1]).float()[0]
        t = token_id(model, target) if target is not None else int(logits.argmax())
        name = model.tokenizer.display([t])[0] if model.tokenizer is not None else str(t)
        if foil is None:
            return Metric("logprob", f"log p({name!r})", target=t)
        f = token_id(model, foil)
        if f == t:
            raise UserError("the target and the foil are the same token")
        return Metric("logit_diff", f"logit({name!r}) − logit({model.tokenizer.display([f])[0]!r})", target=t, foil=f)
    if foil is not None:
        raise UserError(f"--foil is for decoders; {model.info.name} is not one")
    if is_classifier(model):
        c = class_index(model, target) if target is not None else int(clean_out.logits[0].argmax())
        return Metric("class_prob", f"p(class {model.labels.get(c, c)})", target=c)
    if target is not None:
        raise UserError(f"a target is for decoders and classifiers; {model.info.name} is measured by the "
                        "similarity of its embedding")
    pool = "cls" if model.info.modality == "image" and getattr(model.module.cfg, "class_token", False) else "mean"
    what = "[CLS] embedding" if pool == "cls" else "sentence embedding (mean-pooled)"
    return Metric("cosine", f"cosine similarity of the {what} with the clean run's",
                  reference=embedding(clean_out.hidden[:1], pool)[0], pool=pool)
