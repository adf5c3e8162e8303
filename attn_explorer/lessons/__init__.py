"""The lessons: each idea of the attention primer as numbers a learner can change. Pure torch, no Qt.

Every lesson computes with the project's own `core` functions (not a copy of them), so what a learner
sees is what the explorer's models do. The GUI pages live in `attn_explorer.gui.lessons`, one module
per lesson, named after the lesson with "-" as "_".
"""
from __future__ import annotations

# name -> title, in the primer's order. `--lesson NAME` and the Lessons page read this.
LESSONS: dict[str, str] = {
    "by-hand": "1. Attention by hand",
    "inside-a-head": "2. Inside a real head",
    "projections": "3. Q, K, V projections",
    "multi-head": "4. Multi-head attention",
    "order": "5. Order matters",
    "scaling": "6. Why divide by √d_k",
    "block": "7. The Transformer block",
    "coreference": "8. Finding the 'it' head",
    "train-vit": "9. Train a tiny ViT",
    "no-softmax": "10. Attention without a softmax",
}


def lesson_names() -> list[str]:
    return list(LESSONS)
