"""session.vlm.image_blocks: a vision-language run's image tokens as the one-head view's labelled bands, from
image_token_positions; tiny random models built by the parity tests (LLaVA with the class token kept, Qwen2.5-VL's
merged squares, Idefics3's tiles and global view)."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.session.vlm import image_blocks  # noqa: E402
from tests.hub.test_parity_qwen_vl import picture as qwen_picture, qwen_folder  # noqa: E402,F401
from tests.hub.test_parity_vlm import PROMPTS, make, picture  # noqa: E402


def test_qwen_merged_squares_are_one_block(qwen_folder):  # noqa: F811
    _, folder = qwen_folder
    r = ax.load_model(str(folder), device="cpu").run(qwen_picture(27, 37), text="the cat <image> sat on")
    (b,) = image_blocks(r)
    pos = r.image_token_positions
    assert (b.start, b.stop) == (int(pos[0, 0]), int(pos[-1, 0]) + 1) and b.stop - b.start == 15
    assert (b.rows, b.cols) == (3, 5) and b.label == "image 3 × 5" and b.short == "image 3×5"
    assert r.tokens[b.start - 1] != r.tokens[b.start]  # <|vision_start|> before it, not in the band


@pytest.mark.parametrize("name", ["llava-qwen2-full", "idefics3"])
def test_class_token_and_tiles(tmp_path, name):
    make(tmp_path, name)
    r = ax.load_model(str(tmp_path), device="cpu").run(picture(), text=PROMPTS[name])
    blocks = image_blocks(r)
    covered = sorted(i for b in blocks for i in range(b.start, b.stop))
    assert covered == sorted(r.image_token_positions[:, 0].tolist())  # every image token in one band, no other
    if name == "idefics3":
        assert [b.label for b in blocks] == [f"image tile {k + 1} (t{k}), 2 × 2" for k in range(4)] + \
            ["image global view, 2 × 2"]
    else:  # the "full" strategy keeps the tower's class token: in the band, said in its name
        (b,) = blocks
        assert b.label == "image 4 × 4 + class token" and b.stop - b.start == 17


def test_a_text_run_has_none():
    r = ax.load_model("textbook", device="cpu").run("the cat sat")
    assert image_blocks(r) == [] and image_blocks(None) == []


def test_onevision_row_ends_are_not_called_a_class_token(tmp_path):
    """LLaVA OneVision's canvas ends each row with a newline token, which has no place ((row, col) -1, as a tower's
    class token): the band says "+ row ends", one per row, and no view of it claims a class token."""
    from tests.hub.test_parity_vlm_gemma3_onevision import PROMPTS as OV_PROMPTS, make as ov_make

    ov_make(tmp_path, "llava_onevision")
    r = ax.load_model(str(tmp_path), device="cpu").run(picture(), text=OV_PROMPTS["llava_onevision"])
    blocks = image_blocks(r)
    assert not any("class token" in b.label for b in blocks), [b.label for b in blocks]
    pos = r.image_token_positions
    canvas = [b for b in blocks if b.tile == 0]
    (b,) = canvas
    ends = int(((pos[:, 1] == 0) & (pos[:, 3] < 0)).sum())
    assert ends == b.rows and b.stop - b.start == b.rows * (b.cols + 1)  # one newline token after each row
    assert b.label.endswith(f"{b.rows} × {b.cols} + {b.rows} row ends"), b.label
    assert all(r.tokens[i].startswith("<image newline") for i in pos[(pos[:, 1] == 0) & (pos[:, 3] < 0), 0])


def test_onevision_names_its_base_view_and_canvas(tmp_path):
    """OneVision runs without image_tiles, yet it has two views: tile 1 the base view (the whole picture at the
    tower's size, first in the prompt), tile 0 the canvas (the tiles as one grid, a newline after each row). Each
    band says which it is, not a bare "image"."""
    from tests.hub.test_parity_vlm_gemma3_onevision import PROMPTS as OV_PROMPTS, make as ov_make

    ov_make(tmp_path, "llava_onevision")
    r = ax.load_model(str(tmp_path), device="cpu").run(picture(), text=OV_PROMPTS["llava_onevision"])
    assert r.image_tiles is None
    blocks = image_blocks(r)
    (base,) = [b for b in blocks if b.tile == 1]
    (canvas,) = [b for b in blocks if b.tile == 0]
    assert base.start < canvas.start  # the base view's tokens come first in the prompt
    assert base.label == f"image base view, {base.rows} × {base.cols}" and base.short == f"base {base.rows}×{base.cols}"
    assert canvas.label == f"image canvas, {canvas.rows} × {canvas.cols} + {canvas.rows} row ends", canvas.label
    assert canvas.short == f"canvas {canvas.rows}×{canvas.cols}"
