"""`ax.show` in Jupyter: the page in an iframe through `_repr_html_`, a notebook executed with nbclient
that renders it, and (with anywidget) the two-way widget whose clicks set the selection in Python."""
from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pytest

import attn_explorer as ax
from attn_explorer.api.html import page_weights, read_page_data
from attn_explorer.errors import UserError
from tests.api.test_html import fake_run

ROOT = Path(__file__).resolve().parents[2]


def _page_of(repr_html: str) -> str:
    m = re.search(r'srcdoc="([^"]*)"', repr_html)
    assert m, repr_html[:200]
    return html.unescape(m.group(1))


def test_show_is_the_page_in_an_iframe():
    r = fake_run(L=2, H=3, N=6, seed=7)
    v = ax.show(r, view="lines", layer=1, head=2, query=3)
    out = v._repr_html_()
    assert out.startswith("<iframe") and 'sandbox="allow-scripts"' in out
    d = read_page_data(_page_of(out))
    assert (d["view"], d["layer"], d["head"], d["query"]) == ("lines", 1, 2, 3) == ("lines", *v.selection)
    half = np.asarray(d["maps"]["scale"])[:, :, None, None] / 510
    assert (np.abs(page_weights(d) - r.attentions) <= half + 1e-6).all()


def test_show_save_writes_the_page(tmp_path):
    r = fake_run(seed=8)
    p = ax.show(r, view="tokens").save(tmp_path / "p.html")
    assert read_page_data(p.read_text(encoding="utf-8"))["view"] == "tokens"
    assert [q.name for q in tmp_path.iterdir()] == ["p.html"]


def test_show_refuses_bad_options_in_one_line():
    with pytest.raises(UserError, match="unknown view"):
        ax.show(fake_run(), view="model")
    with pytest.raises(UserError, match="image runs"):
        ax.show(fake_run(), view="overlay")


NOTEBOOK = [
    "import numpy as np\nimport attn_explorer as ax\nfrom attn_explorer.api.result import RunResult",
    "rng = np.random.default_rng(0)\n"
    "a = rng.random((2, 2, 5, 5)).astype('float32'); a /= a.sum(-1, keepdims=True)\n"
    "r = RunResult(a, ['[CLS]', 'a', 'b', 'c', '[SEP]'], np.array([1, 0, 0, 0, 1], bool), 'nb', 1.0, 1.0)",
    "ax.show(r, view='head', layer=1, head=0)",
]


def test_notebook_renders_show():
    """A notebook that calls ax.show, executed by nbclient in a real kernel: its output is text/html
    holding the page with the asked-for view."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = nb.cells[-1].outputs
    assert len(outputs) == 1 and outputs[0].output_type == "execute_result", outputs
    d = read_page_data(_page_of(outputs[0].data["text/html"]))
    assert (d["view"], d["layer"], d["head"], d["labels"]) == ("head", 1, 0, ["[CLS]", "a", "b", "c", "[SEP]"])


def test_widget_selection_follows_the_javascript_side():
    """What the page's click handler does (model.set + save_changes) arrives as trait changes: the
    selection in Python is the clicked head."""
    pytest.importorskip("anywidget")
    v = ax.show(fake_run(L=3, H=4, N=6, seed=9), view="grid")
    w = v.widget()
    assert v.selection == (0, 0, 1) and "axBoot" in w._esm and "export default" in w._esm
    w.set_state({"layer": 2, "head": 3, "query": 4})  # the state a front end sends on a click
    assert v.selection == (2, 3, 4)
    assert read_page_data(f'<script type="application/json" class="ax-data">{w.data}</script>')["heads"] == 4


def test_widget_without_anywidget_is_one_line(monkeypatch):
    import builtins

    from attn_explorer.api import notebook

    real_import = builtins.__import__

    def no_anywidget(name, *a, **kw):
        if name == "anywidget":
            raise ImportError("no anywidget here")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(notebook, "_WIDGET_CLASS", None)
    monkeypatch.setattr(builtins, "__import__", no_anywidget)
    with pytest.raises(UserError, match="pip install anywidget"):
        ax.show(fake_run(), widget=True)
