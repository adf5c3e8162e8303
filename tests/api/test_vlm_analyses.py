"""Issue 26: relevance and switching heads off on vision-language models (tiny random LLaVA and Qwen3-VL built
here with transformers' own classes, pictures made here).

- run(image, text=..., ablate={(layer, head): "zero"}) equals transformers eager with that head's slice of
  o_proj's input zeroed (a forward pre-hook): every decoder map and the last hidden state within 1e-5;
- interventions' compare, ablation scan and patching take the pair (image, text) and agree with those runs;
- relevance over image and text tokens (analysis.relevance_vlm): rollout rows sum to 1, placed on the picture
  grid, and a planted case (every layer's pattern: the last token reads one image token only, the others themselves)
  puts AttnLRP's relevance on that token's place and nowhere else."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.api.vlm_tiny import qwen3_vl_folder  # noqa: E402
from tests.hub.test_parity_qwen_vl import PAD  # noqa: E402
from tests.hub.test_parity_vlm import PROMPTS, make, picture  # noqa: E402

TOL = 1e-5
D_HEAD = 8  # both tiny decoders: 48 wide, 6 heads


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            hf = make(folder, "llava") if name == "llava" else qwen3_vl_folder(folder)
            cache[name] = (hf, ax.load_model(str(folder), device="cpu"))
        return cache[name]

    return get


PROMPT = {"llava": PROMPTS["llava"], "qwen3_vl": "the cat <image> sat on"}


def hf_inputs(name, prep) -> dict:
    ids, pixels = prep.inputs["input_ids"], prep.inputs["pixels"]
    if name == "llava":
        return dict(input_ids=ids, pixel_values=pixels)
    patches, grid = pixels
    return dict(input_ids=ids, pixel_values=patches, image_grid_thw=torch.tensor([list(grid)]),
                mm_token_type_ids=(ids == PAD).int())


@pytest.mark.parametrize("name", ["llava", "qwen3_vl"])
def test_ablating_a_head_matches_transformers_with_its_o_proj_input_zeroed(models, name):
    hf, m = models(name)
    img, prompt = picture(), PROMPT[name]
    layer, head = 1, 2
    clean = m.run(img, text=prompt, hidden=True)
    r = m.run(img, text=prompt, ablate={(layer, head): "zero"}, hidden=True)

    def zero_head(_module, args):
        x = args[0].clone()
        x[..., head * D_HEAD:(head + 1) * D_HEAD] = 0
        return (x,)

    o_proj = hf.model.language_model.layers[layer].self_attn.o_proj
    handle = o_proj.register_forward_pre_hook(zero_head)
    try:
        with torch.no_grad():
            ref = hf.model(**hf_inputs(name, m.prepare(img, text=prompt)), output_attentions=True)
    finally:
        handle.remove()
    maps = max(np.abs(r.attentions[i] - a[0].numpy()).max() for i, a in enumerate(ref.attentions))
    hidden = np.abs(r.hidden - ref.last_hidden_state[0].numpy()).max()
    moved = np.abs(r.hidden - clean.hidden).max()
    print(f"{name} ablated L{layer} H{head}: maps {maps:.2e} hidden {hidden:.2e} (moved {moved:.2e} from clean)")
    assert maps <= TOL and hidden <= TOL and moved > 1e-3
    assert np.array_equal(r.attentions[:layer + 1], clean.attentions[:layer + 1])  # maps up to its layer: unchanged


def test_interventions_switch_heads_off_on_a_picture_and_a_prompt(models):
    from attn_explorer.analysis import interventions

    _, m = models("llava")
    x = (picture(), PROMPT["llava"])
    off = m.run(*x[:1], text=x[1], ablate={(1, 2): "zero"}, hidden=True)
    clean = m.run(*x[:1], text=x[1], hidden=True)
    with torch.no_grad():
        p_off = torch.softmax(m.module.logits(torch.from_numpy(off.hidden[-1:])).float(), -1)[0].numpy()
        p_clean = torch.softmax(m.module.logits(torch.from_numpy(clean.hidden[-1:])).float(), -1)[0].numpy()
    c = interventions.compare(m, x, {(1, 2): "zero"})  # two copies: each its own forward (one picture a pass)
    assert c.kind == "decoder" and c.heads == 1 and len(c.tokens) == clean.num_tokens
    assert all(np.abs(p_clean - v).min() < 1e-6 for v in c.before)
    assert all(np.abs(p_off - v).min() < 1e-6 for v in c.after)
    assert np.abs(c.after - c.before).max() > 1e-5
    scan = interventions.ablation_scan(m, x, batch=4)
    t = int(p_clean.argmax())
    assert scan.values.shape == (3, 6) and np.isclose(scan.clean, np.log(p_clean[t]), atol=1e-5)
    assert np.isclose(scan.values[1, 2], np.log(p_off[t]), atol=1e-5)


def test_patching_from_a_clean_picture_into_a_corrupt_one(models):
    """Clean and corrupt: two pictures of one size under one prompt (the same tokens). Every head's output at every
    position patched from the clean run gives the last token the clean run's whole stream (its own embedding is the
    same text token), so the metric comes back exactly; a head scan's cells lie between."""
    from attn_explorer.analysis import interventions

    _, m = models("llava")
    clean, corrupt = (picture(), PROMPT["llava"]), (picture(5), PROMPT["llava"])
    p = interventions.patch(m, clean, corrupt)
    assert abs(p.clean - p.corrupt) > 1e-4 and abs(p.patched - p.clean) < 1e-5
    one = interventions.patch(m, clean, corrupt, heads=[(2, 1)])
    scan = interventions.patching_scan(m, clean, corrupt, per="head", batch=3)
    assert scan.values.shape == (3, 6) and np.isclose(scan.values[2, 1], one.patched, atol=1e-6)


def test_switching_a_head_off_on_tiles_and_a_global_view(tmp_path):
    """Idefics3: five views (2 × 2 tiles and the global view) in one picture's pixels; compare's copies are each
    their own forward, and its intervened copy is run(ablate=...)'s."""
    from attn_explorer.analysis import interventions

    make(tmp_path, "idefics3")
    m = ax.load_model(str(tmp_path), device="cpu")
    x = (picture(), PROMPTS["idefics3"])
    off = m.run(x[0], text=x[1], ablate={(2, 5): "zero"}, hidden=True)
    with torch.no_grad():
        p_off = torch.softmax(m.module.logits(torch.from_numpy(off.hidden[-1:])).float(), -1)[0].numpy()
    c = interventions.compare(m, x, {(2, 5): "zero"})
    assert all(np.abs(p_off - v).min() < 1e-6 for v in c.after) and np.abs(c.after - c.before).max() > 1e-6


@pytest.mark.parametrize("name", ["llava", "qwen3_vl"])
def test_relevance_over_image_and_text_tokens_on_the_picture(models, name):
    from attn_explorer.analysis.relevance import explain
    from attn_explorer.analysis.relevance_vlm import picture_relevance

    _, m = models(name)
    x = (picture(), PROMPT[name])
    r = m.run(x[0], text=x[1])
    pos = r.image_token_positions
    roll = explain(m, x, "rollout")
    assert roll.scores.shape == (r.num_tokens,) and np.isclose(roll.scores.sum(), 1.0, atol=1e-5)
    grid = picture_relevance(roll)
    assert np.array_equal(grid, roll.picture) and roll.image is not None
    rows, cols = int(pos[:, 2].max()) + 1, int(pos[:, 3].max()) + 1
    merge = int(pos[0, 4])
    assert grid.shape == (rows * merge, cols * merge)
    assert np.isclose(grid.sum() / merge ** 2, roll.scores[pos[:, 0]].sum())
    g = explain(m, x, "gradient_rollout")
    assert g.target.startswith("log p(") and np.isfinite(g.scores).all() and (g.scores >= 0).all()
    assert g.scores[pos[:, 0]].sum() > 0  # the picture counts for the next token
    if name == "qwen3_vl":
        with pytest.raises(UserError, match="qwen3_vl: AttnLRP is not offered: DeepStack"):
            explain(m, x, "attnlrp")


def test_relevance_of_a_planted_image_token(models):
    """Every layer's pattern planted: the last token reads image token j only, every other token itself. Then the
    last token's output depends on its own input and j's alone: AttnLRP (gradient × input) is zero elsewhere, and
    gradient rollout adds nothing but j; on the picture, only j's place is lit."""
    from attn_explorer.analysis.relevance import explain
    from attn_explorer.analysis.relevance_vlm import picture_relevance

    _, m = models("llava")
    x = (picture(), PROMPT["llava"])
    pos = m.run(x[0], text=x[1]).image_token_positions
    k = 9
    j, row, col = int(pos[k, 0]), int(pos[k, 2]), int(pos[k, 3])

    def plant(a, _name):
        n = a.shape[-1]
        new = torch.eye(n, dtype=a.dtype).expand(a.shape).clone()
        new[..., -1, :] = 0
        new[..., -1, j] = 1
        return a * 0 + new  # in the graph (relevance's backward reads it), its values the plant's

    with m.hooks({f"blocks.{i}.attn.hook_pattern": plant for i in range(m.info.num_layers)}):
        lrp = explain(m, x, "attnlrp")
        grad = explain(m, x, "gradient_rollout")
    n = len(lrp.scores)
    assert set(np.flatnonzero(lrp.scores)) == {j, n - 1}
    assert set(np.flatnonzero(grad.scores)) <= {j}
    on_picture = picture_relevance(lrp)
    assert set(zip(*np.nonzero(on_picture))) == {(row, col)} and on_picture[row, col] == lrp.scores[j]
