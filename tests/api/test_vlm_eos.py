"""Generation on a vision-language model stops at any of the checkpoint's end tokens: gemma-3-4b-it's config.json
lists two (`"eos_token_id": [1, 106]`: <eos> and <end_of_turn>), and with only one accepted it never stopped. A tiny
random Gemma 3 (tests/hub/test_parity_vlm_gemma3_onevision.make) whose end tokens are set to [an id it never writes,
the k-th token it writes]: VisionLanguageModel.generate and the window's streamed steps stop right there."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.session.vlm_generation import vlm_generation_job  # noqa: E402
from tests.hub.test_parity_vlm import picture  # noqa: E402
from tests.hub.test_parity_vlm_gemma3_onevision import PROMPTS, VOCAB, make  # noqa: E402


@pytest.mark.parametrize("where", ["top", "text_config"])
def test_generation_stops_at_any_of_a_list_of_end_tokens(tmp_path, where):
    make(tmp_path, "gemma3")
    img, text = picture(), PROMPTS["gemma3"]
    free = ax.load_model(str(tmp_path), device="cpu").generate(img, text=text, max_new_tokens=8).ids
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i])  # the first new id after the first token
    never = next(t for t in range(VOCAB - 1, 0, -1) if t not in free)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (cfg if where == "top" else cfg["text_config"])["eos_token_id"] = [never, free[k]]
    if where == "top":
        cfg["text_config"].pop("eos_token_id", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.generate(img, text=text, max_new_tokens=8).ids == free[:k + 1]
    job = vlm_generation_job(m, img, text, 8)
    next(job)  # the prompt
    steps = list(job)
    assert [s.token_id for s in steps] == free[:k + 1] and steps[-1].last and not any(s.last for s in steps[:-1])
