"""Attention in Jupyter: `ax.show(result, view="grid")`.

`show` returns a `PageView`, which Jupyter (classic, Lab, VS Code) draws through `_repr_html_`: the page
of api/html.py in an iframe (its own document, so several views in one notebook never share ids or
styles, and nothing needs a server). `PageView.save(path)` writes the same page to a file.

With the optional `anywidget` package installed, `PageView.widget()` (or `show(..., widget=True)`) is a
two-way widget: clicking a head or a query in the notebook sets `widget.layer`, `widget.head` and
`widget.query` in Python (and `PageView.selection`); setting them from Python redraws the view. Without
anywidget, asking for the widget is one line saying what to install.

`show(result, analysis="name")` draws your own analysis (`ax.register_analysis`) instead: an `AnalysisView`,
one self-contained SVG of its answer (a layer × head grid, a strip under the tokens, or a map) with each
cell's value on hover, in the notebook or saved as .html. In plain Python, where nothing draws HTML, both
views print what they are and how to see them.
"""
from __future__ import annotations

import html
import uuid
from pathlib import Path

import numpy as np

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



def save_page(path, text: str) -> Path:
    """Write a page's text to path, atomically (no half-written file on a failure)."""
    from attn_explorer.files import atomic_write

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return atomic_write(Path(path), write)

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
        return save_page(path, self.html())

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

    def __repr__(self) -> str:
        d = self._data
        return (f"<attention page of {self.result.model}: view {d['view']!r}, {d['layers']} layers × {d['heads']} "
                f"heads, {len(self.result.tokens)} tokens. A notebook draws it; elsewhere call "
                f".save(\"page.html\") and open that file in a browser>")

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
         height: int | None = None, widget: bool = False, analysis: str | None = None):
    """Show a RunResult in Jupyter: view "grid" (every head), "head", "tokens", "lines" or "overlay"
    (image runs), opened on layer/head/query. Returns a PageView (drawn by `_repr_html_`), or with
    widget=True its two-way widget (needs anywidget). analysis="name": your registered analysis of the
    run instead (ax.register_analysis), drawn from its answer's shape: an AnalysisView."""
    if analysis is not None:
        if widget:
            raise UserError("widget=True is for the attention views; an analysis is drawn as one page: "
                            "drop widget=True")
        from attn_explorer.api.analyses import run_analysis

        return AnalysisView(run_analysis(analysis, result), result)
    page = PageView(result, view, layer, head, query, hide_special, log_scale, max_side, height)
    return page.widget() if widget else page


# ---- your own analysis as one page -----------------------------------------------------------------------

# viridis at 9 stops, interpolated to 256 entries (no matplotlib); the window's default colormap
_VIRIDIS = np.array([[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
                     [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]], dtype=np.float64)
_DIVERGING = np.array([[33, 102, 172], [247, 247, 247], [178, 24, 43]], dtype=np.float64)  # blue, white, red
MAX_CELLS = 128  # a map larger than this a side is mean-pooled to it (the page says so)


def _lut(stops: np.ndarray) -> np.ndarray:
    x = np.linspace(0, 1, len(stops))
    t = np.linspace(0, 1, 256)
    return np.stack([np.interp(t, x, stops[:, c]) for c in range(3)], axis=1).round().astype(np.uint8)


def viridis_lut() -> np.ndarray:
    """(256, 3) uint8: viridis, from 9 stops."""
    return _lut(_VIRIDIS)


def _mean_pool(v: np.ndarray, side: int) -> tuple[np.ndarray, list[tuple[int, int]], list[tuple[int, int]]]:
    """v mean-pooled to at most side × side cells, with each cell's (first, last + 1) row and column."""
    def edges(n):
        k = -(-n // side)
        return [(a, min(a + k, n)) for a in range(0, n, k)]

    re, ce = edges(v.shape[0]), edges(v.shape[1])
    out = np.array([[v[a:b, c:d].mean() for c, d in ce] for a, b in re], dtype=np.float64)
    return out, re, ce


def _span(labels: list[str], a: int, b: int) -> str:
    return labels[a] if b - a == 1 else f"{labels[a]}…{labels[b - 1]}"


def answer_svg(answer, max_cells: int = MAX_CELLS) -> tuple[str, str]:
    """(svg, note) of a checked analysis answer: its cells coloured (viridis from 0 to the largest value, or
    blue-white-red around 0 when any is negative), each cell's value in its hover title; note says what was
    pooled ("" when nothing was)."""
    v = np.asarray(answer.values, dtype=np.float64)
    strip = answer.view == "tokens"
    m = v[None, :] if strip else v
    rows, cols = ([answer.name] if strip else list(answer.rows)), list(answer.cols)
    note = ""
    if max(m.shape) > max_cells:
        m, re, ce = _mean_pool(m, max_cells)
        note = f"{v.shape} mean-pooled to {m.shape[0]} × {m.shape[1]} cells for drawing; hover titles give the ranges"
        rows = [_span(rows, a, b) for a, b in re]
        cols = [_span(cols, a, b) for a, b in ce]
    lo, hi = float(m.min()), float(m.max())
    if lo < 0:
        top = max(-lo, hi, 1e-12)
        lut, levels = _lut(_DIVERGING), (-top, top)
    else:
        lut, levels = viridis_lut(), (0.0, hi if hi > 0 else 1e-12)
    idx = np.clip((m - levels[0]) / (levels[1] - levels[0]) * 255, 0, 255).round().astype(int)
    n_r, n_c = m.shape
    cell = int(np.clip(720 // max(n_c, 1), 6, 40))
    cell_h = cell if not strip else max(cell, 24)
    label = max(len(t) for t in rows + cols) if rows + cols else 1
    left = 14 + min(label, 16) * 7 if answer.view != "grid" else 40
    top = 36
    show_cols = cell >= 10 or answer.view == "grid"
    bottom = (14 + min(label, 16) * 6) if answer.view != "grid" and show_cols else 10
    w, h = max(left + n_c * cell, left + 220) + 20, top + n_r * cell_h + bottom + 40
    esc = html.escape
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             f'font-size="11">']
    if answer.view == "grid":
        parts.append(f'<text x="{left}" y="12">head →</text><text x="2" y="{top - 4}">layer ↓</text>')
    for i in range(n_r):
        for j in range(n_c):
            r_, g, b = lut[idx[i, j]]
            where = (f"L{rows[i]} H{cols[j]}" if answer.view == "grid" else cols[j] if strip
                     else f"{rows[i]} → {cols[j]}")
            parts.append(f'<rect x="{left + j * cell}" y="{top + i * cell_h}" width="{cell}" height="{cell_h}" '
                         f'fill="rgb({r_},{g},{b})"><title>{esc(where)}: {m[i, j]:.4g}</title></rect>')
    for j in range(n_c if show_cols else 0):
        x, y = left + j * cell + cell / 2, top + n_r * cell_h + 4
        if answer.view == "grid":
            parts.append(f'<text x="{x}" y="{top - 4}" text-anchor="middle">{esc(cols[j])}</text>')
        else:
            parts.append(f'<text transform="translate({x + 4},{y}) rotate(90)">{esc(cols[j][:16])}</text>')
    for i in range(n_r if (cell_h >= 10) else 0):
        parts.append(f'<text x="{left - 4}" y="{top + i * cell_h + cell_h / 2 + 4}" text-anchor="end">'
                     f'{esc(rows[i][:16])}</text>')
    # the colour scale: a gradient of the lookup table, its two ends labelled
    y = h - 30
    gid = f"ax-scale-{uuid.uuid4().hex[:8]}"
    stops = "".join(f'<stop offset="{k / 8:.3f}" stop-color="rgb({",".join(str(c) for c in lut[k * 255 // 8])})"/>'
                    for k in range(9))
    parts.append(f'<defs><linearGradient id="{gid}">{stops}</linearGradient></defs>'
                 f'<rect x="{left}" y="{y}" width="200" height="10" fill="url(#{gid})"/>'
                 f'<text x="{left}" y="{y + 24}">{levels[0]:.3g}</text>'
                 f'<text x="{left + 200}" y="{y + 24}" text-anchor="end">{levels[1]:.3g}</text></svg>')
    return "".join(parts), note


WHAT = {"grid": "one number per head: layer down, head across", "tokens": "one number per token",
        "map": "a map: row → column"}


class AnalysisView:
    """Your analysis of one run as Jupyter shows it (`_repr_html_`) or a file (`save`): its answer drawn from
    its view, each cell's value on hover."""

    def __init__(self, answer, result):
        self.answer = answer  # an AnalysisAnswer: name, values, view, row and column labels
        self.model = str(result.model)

    @property
    def values(self) -> np.ndarray:
        return self.answer.values

    def _body(self) -> str:
        a = self.answer
        svg, note = answer_svg(a)
        shape = " × ".join(str(s) for s in a.values.shape)
        sub = f"{self.model}: {WHAT[a.view]} ({shape}); hover a cell for its value." + (f" {note}." if note else "")
        return (f'<div class="ax-analysis"><div style="font:bold 14px sans-serif">{html.escape(a.name)}</div>'
                f'<div style="font:12px sans-serif;color:#555;margin:2px 0 6px">{html.escape(sub)}</div>{svg}</div>')

    def html(self) -> str:
        """The whole self-contained page (no script, no network)."""
        return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(self.answer.name)}</title>"
                f"</head><body>{self._body()}</body></html>")

    def save(self, path) -> Path:
        """Write the page to path (.html), atomically."""
        return save_page(path, self.html())

    def _repr_html_(self) -> str:
        return self._body()

    def __repr__(self) -> str:
        a = self.answer
        shape = " × ".join(str(s) for s in a.values.shape)
        return (f"<analysis {a.name!r} of {self.model}: view {a.view!r}, {shape}. A notebook draws it; elsewhere "
                f"call .save(\"page.html\") and open that file in a browser, or read .values>")
