"""Attention in Jupyter: `ax.show(result, view="grid")`.

`show` returns a `PageView`, which Jupyter (classic, Lab, VS Code) draws through `_repr_html_`: the page
of api/html.py in an iframe (its own document, so several views in one notebook never share ids or
styles, and nothing needs a server). `PageView.save(path)` writes the same page to a file.

With the optional `anywidget` package installed, `PageView.widget()` (or `show(..., widget=True)`) is a
two-way widget: clicking a head or a query in the notebook sets `widget.layer`, `widget.head` and
`widget.query` in Python (and `PageView.selection`); setting them from Python redraws the view. Without
anywidget, asking for the widget is one line saying what to install.
"""
from __future__ import annotations

import html
import uuid
from pathlib import Path

from attn_explorer.api.html import MAX_SIDE, page_data, page_html, script_json, viewer_script, viewer_style
from attn_explorer.errors import UserError

# the anywidget module: the page's viewer and a render() that wires its clicks to the widget's traits
_ESM_TAIL = """
export default {
  async render({ model, el }) {
    const root = document.createElement("div");
    el.appendChild(root);
    const viewer = await axBoot(root, JSON.parse(model.get("data")), (layer, head, query) => {
      model.set("layer", layer);
      model.set("head", head);
      model.set("query", query);
      model.save_changes();
    });
    if (!viewer) return;
    const sync = () => viewer.setSelection(model.get("layer"), model.get("head"), model.get("query"));
    for (const k of ["layer", "head", "query"]) model.on(`change:${k}`, sync);
    return () => { for (const k of ["layer", "head", "query"]) model.off(`change:${k}`, sync); };
  },
};
"""


class PageView:
    """One run's page as Jupyter shows it (`_repr_html_`), a file (`save`), or a two-way widget."""

    def __init__(self, result, view: str = "grid", layer: int = 0, head: int = 0, query: int | None = None,
                 hide_special: bool = False, log_scale: bool = False, max_side: int = MAX_SIDE,
                 height: int | None = None):
        self.result = result
        self.options = dict(view=view, layer=layer, head=head, query=query, hide_special=hide_special,
                            log_scale=log_scale, max_side=max_side)
        self._data = page_data(result, **self.options)  # bad options fail here, in one line
        self.height = int(height) if height else _height(self._data)
        self._widget = None

    @property
    def selection(self) -> tuple[int, int, int]:
        """(layer, head, query cell): what the widget's user last picked, or what the page opens on."""
        if self._widget is not None:
            w = self._widget
            return int(w.layer), int(w.head), int(w.query)
        d = self._data
        return d["layer"], d["head"], d["query"]

    def html(self) -> str:
        """The whole self-contained page (the same as `export --out page.html` writes)."""
        return page_html(self.result, **self.options)

    def save(self, path) -> Path:
        """Write the page to path (.html), atomically."""
        from attn_explorer.files import atomic_write

        text = self.html()

        def write(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)

        return atomic_write(Path(path), write)

    def _repr_html_(self) -> str:
        """The page in a sandboxed iframe (scripts only); where the notebook runs the output's script, the
        iframe takes the page's height as the page reports it, else it keeps `height` and scrolls."""
        page = html.escape(self.html(), quote=True)
        fid = f"ax-page-{uuid.uuid4().hex}"
        return (f'<iframe id="{fid}" class="ax-page" srcdoc="{page}" '
                f'style="width:100%;height:{self.height}px;border:0" sandbox="allow-scripts" title="attention">'
                f'</iframe><script>(function () {{ const f = document.getElementById("{fid}"); '
                'window.addEventListener("message", (e) => { if (f && e.source === f.contentWindow && e.data '
                '&& e.data.axPageHeight) f.style.height = (e.data.axPageHeight + 4) + "px"; }); })();</script>')

    def widget(self):
        """The two-way widget (needs anywidget): clicking a head sets widget.layer and widget.head."""
        if self._widget is None:
            cls = widget_class()
            d = self._data
            self._widget = cls(data=script_json(d), layer=d["layer"], head=d["head"], query=d["query"])
        return self._widget


def _height(d: dict) -> int:
    """A first guess at the iframe's height in pixels for the view it opens on (it scrolls beyond)."""
    if d["view"] == "grid":
        return int(min(1400, 260 + d["layers"] * (max(16, min(160, 900 // d["heads"] - 4)) + 4)))
    return 860


_WIDGET_CLASS = None


def widget_class():
    """The anywidget class (built once); a UserError when anywidget is not installed."""
    global _WIDGET_CLASS
    if _WIDGET_CLASS is None:
        try:
            import anywidget
            import traitlets
        except ImportError as e:
            raise UserError("the two-way widget needs anywidget: pip install anywidget "
                            "(without it, ax.show still draws the page)") from e

        class AttentionWidget(anywidget.AnyWidget):
            """One run's views in a notebook; layer, head and query follow the user's clicks."""

            _esm = viewer_script() + _ESM_TAIL
            _css = viewer_style()
            data = traitlets.Unicode("").tag(sync=True)
            layer = traitlets.Int(0).tag(sync=True)
            head = traitlets.Int(0).tag(sync=True)
            query = traitlets.Int(0).tag(sync=True)

        _WIDGET_CLASS = AttentionWidget
    return _WIDGET_CLASS


def show(result, view: str = "grid", layer: int = 0, head: int = 0, query: int | None = None,
         hide_special: bool = False, log_scale: bool = False, max_side: int = MAX_SIDE,
         height: int | None = None, widget: bool = False):
    """Show a RunResult in Jupyter: view "grid" (every head), "head", "tokens", "lines" or "overlay"
    (image runs), opened on layer/head/query. Returns a PageView (drawn by `_repr_html_`), or with
    widget=True its two-way widget (needs anywidget)."""
    page = PageView(result, view, layer, head, query, hide_special, log_scale, max_side, height)
    return page.widget() if widget else page
