"""A vision-language model's inputs as its own processor makes them: the tower's image preprocessing, and the
prompt with the image placeholder repeated once per image token.

- LLaVA (LlavaProcessor): each `<image>` in the prompt becomes `<image>` × image tokens (the patches, plus the
  class token under the "full" strategy); a prompt without one gets "<image>\\n" in front (the place llava-1.5's
  chat template gives it). The tokenizer then adds its own BOS.
- PaliGemma (PaliGemmaProcessor): `<image>` × image tokens, then BOS, the prompt and "\\n"; a prompt that holds
  `<image>` keeps it there and BOS goes after the last one. The whole prompt is the prefix (token type 0).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attn_explorer.errors import UserError
from attn_explorer.hub.images import ImagePreprocess

IMAGE_TOKEN = "<image>"


@dataclass
class Expanded:
    text: str  # the prompt as the tokenizer reads it, the placeholder repeated
    add_special: bool  # whether the tokenizer's own BOS is added (PaliGemma writes its BOS into the text)
    note: str = ""


def vlm_parts(folder: Path, cfg) -> dict:
    """Model(...)'s extra parts for a vision-language folder: the tower's preprocessing."""
    pp_file = Path(folder) / "preprocessor_config.json"
    pp = json.loads(pp_file.read_text(encoding="utf-8")) if pp_file.exists() else None
    return {"preprocess": ImagePreprocess.from_config(pp, cfg.vision.image_size)}


def expand_prompt(kind: str, prompt: str, image_tokens: int, images: int, bos: str | None) -> Expanded:
    """The prompt with each image placeholder repeated image_tokens times, as kind's processor expands it."""
    found = prompt.count(IMAGE_TOKEN)
    if found > images:
        raise UserError(f"the prompt holds {found} {IMAGE_TOKEN} placeholders for {images} image"
                        f"{'s' if images != 1 else ''}: give one {IMAGE_TOKEN} per image, or none")
    block = IMAGE_TOKEN * image_tokens
    if kind == "paligemma":
        if found:
            end = prompt.rfind(IMAGE_TOKEN) + len(IMAGE_TOKEN)
            text = prompt[:end].replace(IMAGE_TOKEN, block) + (bos or "") + prompt[end:] + "\n"
            return Expanded(text, False)
        return Expanded(block + (bos or "") + prompt + "\n", False,
                        "the picture's tokens go first, then the prompt (as PaliGemma's processor puts them)")
    if found:
        return Expanded(prompt.replace(IMAGE_TOKEN, block), True)
    return Expanded(block + "\n" + prompt, True,
                    f"no {IMAGE_TOKEN} in the prompt: the picture goes first, as llava-1.5's chat template puts it")
