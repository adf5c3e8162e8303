"""The HTML page in headless Chromium: each view draws (its screenshot is not blank), hovering changes the
read-out to the token pair and its weight (the stored weight, checked against the run), the notebook's
sandboxed iframe draws, and the anywidget module's clicks reach the widget's model.

Playwright drives Debian's chromium through executable_path (Playwright's own browser download is not
used). Skipped, with the reason, where either is missing.
"""
from __future__ import annotations

import io
import os
import re
import shutil

import numpy as np
import pytest

from attn_explorer.api.html import page_html
from tests.api.test_html import fake_run

sync_api = pytest.importorskip("playwright.sync_api", reason="the Python package playwright is not installed")


def chromium_path() -> str | None:
    """$AX_CHROMIUM, or Debian's chromium on PATH."""
    for name in (os.environ.get("AX_CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def browser():
    exe = chromium_path()
    if exe is None:
        pytest.skip("no chromium on PATH (apt-get install chromium, or set AX_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])  # root in CI: no user namespaces
        yield b
        b.close()


@pytest.fixture
def page(browser):
    pg = browser.new_page(viewport={"width": 1100, "height": 800})
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    pg.close()
    assert not errors, errors


def _open(page, tmp_path, r, **kw):
    f = tmp_path / "page.html"
    f.write_text(page_html(r, **kw), encoding="utf-8")
    page.goto(f.as_uri())
    page.wait_for_selector(".ax-root[data-ax-ready='1']", timeout=10000)


def _not_blank(png: bytes) -> None:
    from PIL import Image

    a = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3)
    colours = np.unique(a, axis=0).shape[0]
    a = a.astype(int)
    # share of coloured pixels (the maps, lines and picture; labels are grey): a view with nothing drawn has ~0
    coloured = float(((a.max(axis=1) - a.min(axis=1)) > 40).mean())
    assert colours > 20 and coloured > 0.01, (colours, coloured)


READOUT = re.compile(r"^L(\d+) H(\d+) · query “([^”]*)” \((\d+)\) → (?:key|patch) “([^”]*)” \((\d+)\): (\d\.\d{3})")


def _hover_reads(page, selector, fx, fy):
    """Hover at (fx, fy) of the element's box; the read-out's numbers: layer, head, query, key, weight."""
    box = page.locator(selector).first.bounding_box()
    page.mouse.move(box["x"] + fx * box["width"], box["y"] + fy * box["height"])
    return _parse(page.inner_text(".ax-readout"))


def _parse(text):
    """A read-out's layer, head, query index, key index and weight."""
    m = READOUT.match(text)
    assert m, text
    return int(m[1]), int(m[2]), int(m[4]), int(m[6]), float(m[7])


@pytest.mark.parametrize("view", ["grid", "head", "lines", "overlay"])
def test_each_view_draws_and_hover_reads_the_weight(page, tmp_path, view):
    r = fake_run(image=True, seed=11) if view == "overlay" else fake_run(L=2, H=3, N=12, seed=11)
    _open(page, tmp_path, r, view=view, layer=1, head=2)
    assert page.get_attribute(".ax-root", "data-ax-view") == view
    _not_blank(page.locator(".ax-stage").screenshot())
    idle = page.inner_text(".ax-readout")
    fx, fy = {"lines": (0.05, 0.4)}.get(view, (0.6, 0.45))
    first = _hover_reads(page, ".ax-map", fx, fy)
    assert page.inner_text(".ax-readout") != idle
    second = _hover_reads(page, ".ax-map", fx, min(0.95, fy + 0.4))
    assert second != first  # another place, another pair
    for li, hi, q, k, w in (first, second):
        assert abs(w - float(r.attentions[li, hi, q, k])) <= r.attentions[li, hi].max() / 510 + 5e-4


def test_token_focus_draws_and_hover_reads_the_weight(page, tmp_path):
    r = fake_run(L=2, H=3, N=12, seed=12)
    _open(page, tmp_path, r, view="tokens", layer=0, head=1, query=4)
    _not_blank(page.locator(".ax-stage").screenshot())
    tokens = page.locator(".ax-token")
    assert tokens.count() == 12
    seen = set()
    for j in (2, 7):
        tokens.nth(j).hover()
        li, hi, q, k, w = _parse(page.inner_text(".ax-readout"))
        assert (li, hi, q, k) == (0, 1, 4, j)
        assert abs(w - float(r.attentions[0, 1, 4, j])) <= r.attentions[0, 1].max() / 510 + 5e-4
        seen.add(page.inner_text(".ax-readout"))
    assert len(seen) == 2
    tokens.nth(7).click()  # a click makes it the query
    assert "ax-query" in tokens.nth(7).get_attribute("class")


def test_tabs_switch_views_and_grid_double_click_opens_the_head(page, tmp_path):
    r = fake_run(L=2, H=3, N=10, seed=13)
    _open(page, tmp_path, r, view="grid")
    for v in ("head", "tokens", "lines", "grid"):
        page.click(f".ax-tab[data-view={v}]")
        assert page.get_attribute(".ax-root", "data-ax-view") == v
    box = page.locator(".ax-map").bounding_box()
    left, top, gap = 34, 18, 4
    step = (box["width"] - left) / 3
    page.mouse.dblclick(box["x"] + left + 2 * step + 5, box["y"] + top + step + 5)  # L1 H2
    assert page.get_attribute(".ax-root", "data-ax-view") == "head"
    assert page.input_value(".ax-controls select >> nth=0") == "1"
    assert page.input_value(".ax-controls select >> nth=1") == "2"
    linear = page.locator(".ax-map").screenshot()
    page.check(".ax-controls input[type=checkbox]")  # log colour: the same head, coloured otherwise
    assert page.locator(".ax-map").screenshot() != linear
    assert "(log)" in page.inner_text(".ax-legend")


def test_notebook_iframe_draws(page):
    """What Jupyter shows for ax.show: the page in a sandboxed iframe (scripts only, no same origin), as
    tall as the page says it is."""
    import attn_explorer as ax

    page.set_content("<html><body>" + ax.show(fake_run(seed=14), view="head", height=120)._repr_html_() +
                     "</body></html>")
    frame = page.frame_locator("iframe.ax-page")
    frame.locator(".ax-root[data-ax-ready='1']").wait_for(timeout=10000)
    assert frame.locator(".ax-root").get_attribute("data-ax-view") == "head"
    _not_blank(frame.locator(".ax-stage").screenshot())
    # the page reported its height and the iframe took it: no 120 px window onto a taller page
    page.wait_for_function("document.querySelector('iframe.ax-page').getBoundingClientRect().height > 400")


def test_widget_module_click_sets_the_models_selection(page):
    """The anywidget module (the viewer plus its render()) against a stand-in for anywidget's model: a
    click on head L1 H2 of the grid sets layer, head and query and saves them (what reaches Python); a
    change from Python redraws the selection without echoing it back."""
    pytest.importorskip("anywidget")
    import attn_explorer as ax

    w = ax.show(fake_run(L=2, H=3, N=8, seed=15), view="grid").widget()
    page.set_content("<html><body><div id='el' style='width:900px'></div></body></html>")
    page.evaluate("""async ([esm, data]) => {
        const state = {data, layer: 0, head: 0, query: 1}, handlers = {};
        window.saved = [];
        window.fromPython = (k, v) => { state[k] = v; handlers[`change:${k}`](); };
        const model = {get: (k) => state[k], set: (k, v) => { state[k] = v; },
                       save_changes: () => window.saved.push([state.layer, state.head, state.query]),
                       on: (e, f) => { handlers[e] = f; }, off: () => {}};
        const url = URL.createObjectURL(new Blob([esm], {type: "text/javascript"}));
        const mod = await import(url);
        await mod.default.render({model, el: document.getElementById("el")});
    }""", [w._esm, w.data])
    page.wait_for_selector(".ax-root[data-ax-ready='1']")
    box = page.locator("#el canvas").bounding_box()
    step = (box["width"] - 34) / 3
    page.mouse.click(box["x"] + 34 + 2 * step + 5, box["y"] + 18 + step + 5)
    assert page.evaluate("window.saved") == [[1, 2, 1]]
    page.evaluate("window.fromPython('head', 0)")  # Python sets widget.head: the view follows, tells nobody
    assert page.input_value("#el .ax-controls select >> nth=1") == "0"
    assert page.evaluate("window.saved") == [[1, 2, 1]]
