"""Issue 26 B: generation after a picture and a prompt, streamed step by step (session.vlm_generation) on tiny
random vision-language models built in the test (tests/hub/test_parity_vlm.make): the same greedy tokens and
rows as VisionLanguageModel.generate, each step's row put back on the picture as api.vlm.image_overlay does,
and the Generate page's session streaming it."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.session.vlm_generation import VlmPromptInfo, step_overlay, vlm_generation_job  # noqa: E402
from tests.hub.test_parity_qwen_vl import picture as qwen_picture, qwen_folder  # noqa: E402,F401
from tests.hub.test_parity_vlm import PROMPTS, make, picture  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            make(folder, name)
            cache[name] = folder
        return cache[name]

    return get


def _steps(m, image, text, n):
    job = vlm_generation_job(m, image, text, n)
    prompt = next(job)
    return prompt, list(job)


@pytest.mark.parametrize("name", ["llava", "idefics3", "paligemma"])
def test_streamed_steps_equal_generate(folders, name):
    m = ax.load_model(str(folders(name)), device="cpu")
    prompt, steps = _steps(m, picture(), PROMPTS[name], 6)
    want = m.generate(picture(), text=PROMPTS[name], max_new_tokens=6)
    assert isinstance(prompt, VlmPromptInfo) and prompt.ids == want.prompt_ids
    assert np.array_equal(prompt.image_token_positions, want.image_token_positions)
    assert prompt.image is not None and prompt.image.ndim == 3
    assert [s.token_id for s in steps] == want.ids and [s.token for s in steps] == want.tokens
    for s, row in zip(steps, want.rows):
        assert s.attention.shape == row.shape and np.array_equal(s.attention, row)
    n0 = len(prompt.ids)
    assert [s.position for s in steps] == list(range(n0, n0 + len(steps)))
    assert steps[-1].last and all(s.top_probs == sorted(s.top_probs, reverse=True) and len(s.top_probs) == 10
                                  and sum(s.top_probs) <= 1 + 1e-6 for s in steps)
    assert steps[0].top_ids[0] == steps[0].token_id  # greedy: the top bar is the token written


@pytest.mark.parametrize("name", ["llava", "idefics3"])
def test_the_first_steps_overlay_is_the_prompts_last_token(folders, name):
    """Step 0's row is the last prompt token's row of a run on the picture and the prompt: its overlay is
    image_overlay's for that token, for one head, one layer averaged and every layer and head."""
    from attn_explorer.api.vlm import image_overlay

    m = ax.load_model(str(folders(name)), device="cpu")
    prompt, steps = _steps(m, picture(), PROMPTS[name], 3)
    r = m.run(picture(), text=PROMPTS[name])
    pos = r.image_token_positions
    for average, layer, head in (("head", 1, 2), ("layer", 2, None), ("all", None, None)):
        got = step_overlay(steps[0], prompt, layer or 0, head or 0, average)
        want = image_overlay(r, r.num_tokens - 1, layer, head)
        assert np.allclose(got.picture, want.picture, atol=1e-6), average
        L = range(r.attentions.shape[0]) if layer is None else [layer]
        H = range(r.attentions.shape[1]) if head is None else [head]
        row = np.mean([r.attentions[i, h, -1] for i in L for h in H], axis=0)
        assert np.isclose(got.total, row[pos[:, 0]].sum(), atol=1e-6)
        assert (got.global_weight > 0) == (name == "idefics3") and 0 <= got.total <= 1 + 1e-6
    later = step_overlay(steps[2], prompt, 0, 0, "all")  # a later step: its own row, the same picture
    assert later.picture.shape == got.picture.shape and not np.allclose(later.picture, got.picture)
    with pytest.raises(ValueError, match="average must be"):
        step_overlay(steps[0], prompt, 0, 0, "some")


def test_generation_session_streams_a_vision_language_model(qtbot, folders):
    from PIL import Image

    from attn_explorer.session.generation import GenerationSession
    from attn_explorer.session.state import SessionState

    folder = folders("llava")
    img = folder / "picture.png"
    Image.fromarray(picture()).save(img)
    state = SessionState(device="cpu")
    state.load_model(str(folder), want_image=True)
    state.set_image(str(img))
    qtbot.waitUntil(lambda: state.info is not None and not state.busy, timeout=60000)
    gen = GenerationSession(state)
    assert gen.can_generate and gen.is_vlm and gen.has_chat is False
    seen, ends = [], []
    gen.step_arrived.connect(lambda s: seen.append(len(gen.steps)))
    gen.finished.connect(ends.append)
    assert gen.start(PROMPTS["llava"], chat=True, temperature=1.0, max_new_tokens=4)  # greedy: both ignored
    qtbot.waitUntil(lambda: bool(ends), timeout=60000)
    assert ends == ["done"] and gen.temperature == 0.0 and not gen.chat
    assert isinstance(gen.prompt, VlmPromptInfo) and len(gen.prompt.image_token_positions) == 16
    assert seen == list(range(1, len(gen.steps) + 1))  # one signal per step, as each arrives
    want = ax.load_model(str(folder), device="cpu").generate(str(img), text=PROMPTS["llava"], max_new_tokens=4)
    assert [s.token_id for s in gen.steps] == want.ids
    state.shutdown()


def test_streamed_steps_equal_generate_on_qwen2_5_vl(qwen_folder):  # noqa: F811
    """M-RoPE: the prompt's (t, h, w) positions and the delta the cache keeps for the new tokens."""
    _, folder = qwen_folder
    m = ax.load_model(str(folder), device="cpu")
    img, text = qwen_picture(27, 37), "the cat <image> sat on"
    prompt, steps = _steps(m, img, text, 5)
    want = m.generate(img, text=text, max_new_tokens=5)
    assert [s.token_id for s in steps] == want.ids and len(prompt.image_token_positions) == 15
    assert all(np.array_equal(s.attention, row) for s, row in zip(steps, want.rows))
    assert step_overlay(steps[-1], prompt, 0, 0, "all").picture.shape == (6, 10)  # 3 × 5 tokens, merges undone
