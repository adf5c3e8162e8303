"""Relevance of a vision-language model's next token, over its image and text tokens, put back on the picture.

    rel = explain(m, ("cat.png", "USER: <image>\\nWhat is this? ASSISTANT:"), "gradient_rollout")
    rel.scores                 # (N,): every decoder token's relevance, image and text
    rel.picture                # (rows, cols) in patch units: each image token's relevance at its place

The score is the decoder's next token after the prompt (the most likely one, or `target`): its log-probability for
the gradient methods and the two attention baselines, its logit for AttnLRP (analysis.relevance). The rules are
analysis.relevance's, applied to the decoder's layers (the tower is read through, not explained: its own maps
have the image overlay); the image tokens' relevance is placed as the attention overlay places a token's
attention (api.vlm.place_on_picture: tiles assembled, merges undone).

AttnLRP is refused for Qwen3-VL: DeepStack adds the tower's features to the image tokens after the decoder's first
layers, which gradient × input at the first block does not see (its relevance would leave that part out).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from attn_explorer.analysis.relevance import Relevance, check_method, next_token_score, token_id, token_relevance
from attn_explorer.api.model import Model
from attn_explorer.api.vlm import place_on_picture
from attn_explorer.errors import UserError

__all__ = ["explain_picture", "picture_relevance"]


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
