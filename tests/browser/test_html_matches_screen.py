"""The HTML page draws what the window draws (headless Chromium; skipped without it, as test_html_chromium):

- the patch overlay: heat from 0 to the query's 98th-percentile patch weight (the app's CLIP_PERCENTILE in
  gui/widgets/overlay.py), opacity growing with the weight (alpha·sqrt(q)), so a patch the query does not
  look at shows the photo untouched; and a colour bar with that scale;
- a pooled text page's axes: token positions (cell i covers tokens [edge_i, edge_i+1)), not cell numbers.

Canvas text cannot be read back, so an init script records every fillText call (text, position, colour).
"""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.api.html import page_html, read_page_data
from attn_explorer.api.result import RunResult
from attn_explorer.maths import pool_edges
from tests.browser.test_html_chromium import browser, page  # noqa: F401 - the fixtures

RECORD_TEXT = """
window.axTexts = [];
const real = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
  const m = this.getTransform();
  window.axTexts.push({text: String(text), canvas: this.canvas.className, x: m.a * x + m.c * y + m.e,
                       y: m.b * x + m.d * y + m.f, fill: String(this.fillStyle)});
  return real.call(this, text, x, y, ...rest);
};
"""
GREY = 140


def _open(page, tmp_path, r, **kw):
    page.add_init_script(RECORD_TEXT)
    f = tmp_path / "page.html"
    f.write_text(page_html(r, **kw), encoding="utf-8")
    page.goto(f.as_uri())
    page.wait_for_selector(".ax-root[data-ax-ready='1']", timeout=10000)
    return read_page_data(f.read_text(encoding="utf-8"))


def _texts(page, canvas=None):
    return [t for t in page.evaluate("window.axTexts") if canvas is None or canvas in t["canvas"]]


def image_run(seed=20) -> RunResult:
    """A 10 × 10-patch run over a flat grey picture (14 px patches). [CLS]'s row: 20 patches get no weight,
    78 small weights up to 0.008, and two strong patches (0.015, 0.018) above the 98th percentile; [CLS]
    keeps the rest. Other rows: seeded softmax."""
    rng = np.random.default_rng(seed)
    grid, N = (10, 10), 101
    att = rng.random((1, 1, N, N)).astype(np.float32) ** 8
    att /= att.sum(-1, keepdims=True)
    row = np.zeros(100, np.float32)
    order = rng.permutation(100)
    row[order[20:98]] = np.linspace(0.001, 0.008, 78, dtype=np.float32)
    row[order[98]], row[order[99]] = 0.015, 0.018
    att[0, 0, 0, 1:] = row
    att[0, 0, 0, 0] = 1 - row.sum()
    toks = ["[CLS]"] + [f"r{i}c{j}" for i in range(10) for j in range(10)]
    pic = np.full((140, 140, 3), GREY, np.uint8)
    r = RunResult(att, toks, np.array([True] + [False] * 100), "fake-vit", 1.0, 1.0, grid=grid, image=pic,
                  patch_offset=1)
    r.zero_patches, r.strong = order[:20], order[98:]
    return r


def _patch_pixels(png: bytes, patch: int):
    """The RGB pixels of patch p's inner part (a margin off its edges) in a screenshot of the overlay."""
    import io

    from PIL import Image

    a = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    h, w = a.shape[:2]
    r, c = divmod(int(patch), 10)
    y0, y1, x0, x1 = r * h // 10, (r + 1) * h // 10, c * w // 10, (c + 1) * w // 10
    return a[y0 + 3: y1 - 3, x0 + 3: x1 - 3].reshape(-1, 3)


def test_overlay_leaves_the_photo_untinted_where_the_query_does_not_look(page, tmp_path):
    r = image_run()
    _open(page, tmp_path, r, view="overlay")
    shot = page.locator(".ax-map").screenshot()
    for p in r.zero_patches[:6]:  # weight 0: the photo as it is (the app's opacity is alpha·sqrt(0) = 0)
        px = _patch_pixels(shot, p)
        assert np.abs(px - GREY).max() <= 2, (p, px.mean(axis=0))
    for p in r.strong:  # above the 98th percentile: saturated, viridis' yellow mixed in
        px = _patch_pixels(shot, p).mean(axis=0)
        assert px[0] > GREY + 20 and px[2] < GREY - 20, (p, px)


def test_overlay_colour_scale_is_the_98th_percentile_with_a_colour_bar(page, tmp_path):
    r = image_run()
    d = _open(page, tmp_path, r, view="overlay")
    from attn_explorer.api.html import page_weights

    patches = page_weights(d)[0, 0, 0, 1:]  # the stored (8-bit) weights the page colours
    p98 = float(np.percentile(patches, 98))
    assert 0.0075 < p98 < 0.0095 and patches.max() > 0.017  # the window's scale, not the largest weight
    bars = page.locator(".ax-stage .ax-colourbar")
    assert bars.count() == 1
    labels = [t["text"] for t in _texts(page, "ax-colourbar")]
    assert f"{p98:.3f}" in labels and "0" in labels, labels
    assert "98th" in page.inner_text(".ax-legend")
    # two patches just under and over the top: the over one is no brighter than the top colour
    shot = page.locator(".ax-map").screenshot()
    a, b = (_patch_pixels(shot, p).mean(axis=0) for p in r.strong)
    assert np.abs(a - b).max() <= 3, (a, b)  # both saturate


def long_text_run(N=4055, seed=21) -> RunResult:
    """One head over N tokens as a lazy run: only its pooled view (256 cells a side, a strong diagonal) is
    ever read, so the page is built without an N × N map."""
    rng = np.random.default_rng(seed)
    cells = 256
    edges = pool_edges(N, cells)

    class Pooled(RunResult):
        def attention(self, layer, head, rows=None, cols=None, pool=None, reduce="max"):
            assert pool == cells
            a = rng.random((cells, cells)).astype(np.float32) * 1e-3
            a[np.arange(cells), np.arange(cells)] = 0.5
            return a

    toks = ["<s>"] + [f"w{i}" for i in range(N - 1)]
    special = np.array([True] + [False] * (N - 1))
    r = Pooled(_Shape((1, 1, N, N)), toks, special, "fake-llama", 1.0, 1.0, lazy=object())
    r.edges = edges
    return r


class _Shape:
    """A lazy run's `attentions`: only its shape."""

    def __init__(self, shape):
        self.shape = shape


def test_a_pooled_page_labels_its_axes_with_token_positions(page, tmp_path):
    """4,055 tokens in 256 cells; the page opens on token 1,013, which STARTS cell 64 (edge 64 =
    floor(64 · 4055 / 256)). Its row is outlined and labelled with that token's position, and every axis
    label is a token position (a cell's first token, up to 4,039), never a cell number (0-255)."""
    r = long_text_run()
    edges = r.edges
    c = 64
    t = int(edges[c])  # a token that starts a cell
    assert t not in (c, int(edges[c - 1])) and int(edges[c + 1]) > t + 1
    d = _open(page, tmp_path, r, view="head", query=t)
    assert d["query"] == c and d["token_index"][c] == t
    assert page.input_value(".ax-controls select >> nth=2") == str(c)  # the query picker shows the cell
    nums = [t_ for t_ in _texts(page, "ax-map") if t_["text"].replace(",", "").isdigit()]
    values = {int(t_["text"].replace(",", "")) for t_ in nums}
    assert values and values <= set(int(e) for e in edges[:-1]), sorted(values)
    assert max(values) > 3000  # positions run to the end of the text, not to 255
    assert str(t) in {t_["text"].replace(",", "") for t_ in nums if t_["fill"] == "#ff7f0e"}  # the query row
    # the token just before it is in the cell before
    d2 = read_page_data(page_html(r, view="head", query=t - 1))
    assert d2["query"] == c - 1
