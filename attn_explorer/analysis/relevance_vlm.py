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

from attn_explorer.analysis.relevance import explain_picture, picture_relevance

__all__ = ["explain_picture", "picture_relevance"]
