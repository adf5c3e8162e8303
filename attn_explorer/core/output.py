"""What every model family's forward returns."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    hidden: torch.Tensor  # (B, N, D) last hidden state (after the final norm, where the model has one)
    attentions: torch.Tensor | None = None  # (B, L, H, N, N) when asked for
    logits: torch.Tensor | None = None  # (B, num_labels) for image classifiers
    grid: tuple[int, int] | None = None  # image models: patch grid (rows, cols)
