"""What a generation job sends before its first step: the prompt as the model reads it (session.generation for
text models, session.vlm_generation for vision-language models, whose VlmPromptInfo adds the picture)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PromptInfo:
    """The prompt as the model reads it (after the chat template), sent before the first step."""

    text: str
    tokens: list[str]
    ids: list[int]
