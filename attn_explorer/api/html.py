"""One self-contained HTML page of a run: every head's map, one head, token focus, lines and the patch
overlay, with hover read-outs, openable offline in any recent browser (no network, no server).

`page_html(result, view="grid", ...)` is the one renderer: the notebook (`api.notebook.show`), the CLI
(`export --out page.html`) and the window (File → Export page as HTML…, through session.html_export) all
call it. The page is the viewer's script and style (resources/html/, inlined) and one JSON block of data:

- each query's row of each head quantised to 8 bits against the row's own largest weight (`row_scale`), so a
  stored level q reads back as q · row_scale / 255, within half a step of the exact weight (a row of small
  weights beside a large one elsewhere in the head keeps its detail: the overlay colours one row); in an image
  run the keys before the patches ([CLS], registers) have their own (`prefix_scale`), since [CLS] often takes
  most of a row whose patch weights are near 0.01; each head's largest weight (`scale`) sets the colours of
  the map views; the page says so;
- the levels deflated (zlib) and base64-encoded: the browser unpacks them with its DecompressionStream;
- long inputs read through `RunResult.attention(layer, head, pool=...)` and pooled to at most
  `max_side` cells a side (each the max of the tokens it covers), never the whole (L, H, N, N) stack.

NumPy, json and the standard library only: this module never imports torch (a lazy result's store runs
torch inside `attention`, which is why the window builds its page in a worker).
"""
from __future__ import annotations

import base64
import html
import json
import zlib
from dataclasses import dataclass

import numpy as np

from attn_explorer.errors import UserError
from attn_explorer.maths import hidden_tokens, kept_tokens, pool_edges, without_specials
from attn_explorer.resources import resource_path

VIEWS = ("grid", "head", "tokens", "lines", "overlay")
FORMAT = "attn-explorer-page"
VERSION = 2  # 2: levels against each row's largest weight (maps.row_scale)
MAX_SIDE = 256  # text: longer inputs are pooled to this many cells a side
IMAGE_MAX_TOKENS = 1025  # images keep one cell a patch (the overlay needs it): 32 × 32 patches and [CLS]
LEVELS = 255  # 8-bit levels above zero
UNTRAINED = "Untrained model (random weights): patterns mean nothing."


def builtin_note(model: str) -> str:
    """The note the window shows for a built-in model whose weights are not the original ones, by name (a
    page written from a result alone, by the CLI or the notebook, has no ModelInfo to read it from)."""
    if model == "dinov2-small":
        from attn_explorer.hub.dinov2_graph import NOTE  # plain strings: no torch, no onnx

        return NOTE
    return ""


@dataclass(frozen=True)
class PageMaps:
    """What the page stores of a run's maps: 8-bit levels (L, H, n, n), each head's scale, and how the
    n rows and columns relate to the run's tokens."""

    levels: np.ndarray  # uint8 (L, H, n, n): round(weight / row_scale · 255)
    scale: np.ndarray  # float32 (L, H): each head's largest weight shown (1 for an all-zero map)
    row_scale: np.ndarray  # float32 (L, H, n): each row's largest weight over keys >= split (1 for zeros)
    prefix_scale: np.ndarray | None  # image runs: float32 (L, H, n), the same over keys < split ([CLS] ...)
    labels: list[str]  # n row/column labels
    special: list[bool]  # n: the cell is a special token
    tokens: np.ndarray  # int (n,): the run's token index of each cell (its first token when pooled)
    edges: np.ndarray | None  # pooled: int (n + 1,) token edges of the cells; None: one cell a token
    hidden_special: bool  # special tokens were removed and rows renormalised


def _row_max(a: np.ndarray) -> np.ndarray:
    """float32 (n,) largest value of each row of a, 1 for a row with none above 0."""
    rows = a.max(axis=1) if a.shape[1] else np.zeros(a.shape[0])
    return np.where(rows > 0, rows, 1.0).astype(np.float32)


def quantise(a: np.ndarray, split: int = 0) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """(n, n) float weights -> (uint8 levels, scale, row_scale, prefix_scale): level = round(a / s · 255),
    where s is the row's largest weight over keys >= split (row_scale) or over keys < split (prefix_scale);
    scale is the map's largest weight (1 for zeros). A level reads back as level · s / 255, within s / 510."""
    a = np.nan_to_num(np.asarray(a, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    a = np.clip(a, 0.0, None)
    rows, prefix = _row_max(a[:, split:]), _row_max(a[:, :split])
    s = np.concatenate([np.repeat(prefix[:, None], split, axis=1),
                        np.repeat(rows[:, None], a.shape[1] - split, axis=1)], axis=1).astype(np.float64)
    top = float(a.max()) if a.size else 0.0
    scale = top if top > 0 else 1.0
    return np.rint(a / s * LEVELS).astype(np.uint8), scale, rows, prefix


def _shape(r) -> tuple[int, int, int]:
    """(L, H, N) of a run, dense or lazy: only the maps' `.shape` is read (a lazy run's `attentions`
    has one and refuses to give values)."""
    shape = tuple(getattr(r.attentions, "shape", ()) or ())
    if len(shape) != 4 or 0 in shape:
        raise UserError("this run has no attention maps to put on a page")
    return int(shape[0]), int(shape[1]), int(shape[2])


def _label(tok: str) -> str:
    """A token as the page labels it: a blank one (a space, a newline) shown as its repr."""
    return tok if tok.strip() else repr(tok)


def page_maps(r, max_side: int = MAX_SIDE, hide_special: bool = False, progress=None) -> PageMaps:
    """Read every head's map through r.attention (pooled when N > max_side) and quantise it.
    progress(fraction, message), when given, is called after each head (it may raise to stop)."""
    L, H, N = _shape(r)
    image = r.grid is not None
    side = IMAGE_MAX_TOKENS if image else int(max_side)
    if image and N > side:
        raise UserError(f"an image run of {N} patches is too big for a page (at most {IMAGE_MAX_TOKENS - 1})")
    pooled = N > side
    hide = bool(hide_special) and not pooled and not image and kept_tokens(r.special, N).size < N
    keep = kept_tokens(r.special, N) if hide else np.arange(N)
    n = side if pooled else keep.size
    levels = np.zeros((L, H, n, n), dtype=np.uint8)
    scale = np.ones((L, H), dtype=np.float32)
    row_scale = np.ones((L, H, n), dtype=np.float32)
    split = int(getattr(r, "patch_offset", 0) or 0) if image else 0
    prefix_scale = np.ones((L, H, n), dtype=np.float32) if split else None
    for li in range(L):
        for hi in range(H):
            a = r.attention(li, hi, pool=side if pooled else None, reduce="max")
            if hide:
                a = without_specials(a, r.special)
            levels[li, hi], scale[li, hi], row_scale[li, hi], prefix = quantise(a, split)
            if split:
                prefix_scale[li, hi] = prefix
            if progress is not None:
                progress((li * H + hi + 1) / (L * H), f"page: head {li * H + hi + 1} of {L * H}")
    tokens, special = list(r.tokens), np.asarray(r.special, dtype=bool)
    if pooled:
        edges = pool_edges(N, side)
        labels = [_pooled_label(tokens, int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
        spec = [bool(special[a:b].all()) for a, b in zip(edges[:-1], edges[1:])]
        return PageMaps(levels, scale, row_scale, None, labels, spec, edges[:-1].copy(), edges, False)
    return PageMaps(levels, scale, row_scale, prefix_scale, [_label(tokens[i]) for i in keep], [bool(special[i]) for i in keep],
                    keep, None, hide)


def _pooled_label(tokens: list[str], a: int, b: int) -> str:
    """A pooled cell's label: the tokens it covers, "tok … tok (a–b)"."""
    if b - a <= 1:
        return f"{_label(tokens[a])} ({a})"
    return f"{_label(tokens[a])} … {_label(tokens[b - 1])} ({a}–{b - 1})"


def pack(a: np.ndarray, dtype=np.uint8) -> str:
    """uint8 (or little-endian float32) array -> base64 of its zlib-deflated bytes (what the page's
    DecompressionStream("deflate") reads)."""
    # level 6: within 4 % of level 9's size at a seventh of its time (DINOv2-S: 0.6 s against 4.5 s)
    raw = np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def unpack(text: str, shape, dtype=np.uint8) -> np.ndarray:
    """The inverse of `pack` (tests read a page's data back with it)."""
    raw = zlib.decompress(base64.b64decode(text))
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape)


def page_notes(r, m: PageMaps, N: int, model_note: str | None = None, trained: bool = True) -> list[str]:
    """The page's honest remarks: what the model is (its note, as the window shows it: `model_note`, or the
    built-in's by name when None; untrained), how the weights were stored, pooling, hidden tokens, the run's
    own notes."""
    note = builtin_note(str(r.model)) if model_note is None else str(model_note)
    notes = ([] if trained else [UNTRAINED]) + ([note] if note else [])
    notes += ["Weights stored as 8-bit: each query's row in 255 steps of its own largest weight (step at most "
              "1/255 ≈ 0.0039 of it); read-outs are exact to half a step."]
    if m.edges is not None:
        notes.append(f"Pooled: {N} tokens shown as {len(m.labels)} × {len(m.labels)} cells, each the largest "
                     "weight of the tokens it covers.")
    if m.hidden_special:
        notes.append("Special tokens hidden; each row renormalised over the tokens shown.")
    if getattr(r, "decoder_attentions", None) is not None:
        notes.append("Encoder self-attention only: the decoder's and cross-attention maps are not on this page.")
    return notes + [str(n) for n in getattr(r, "notes", [])]


def page_data(r, view: str = "grid", layer: int = 0, head: int = 0, query: int | None = None,
              max_side: int = MAX_SIDE, hide_special: bool = False, log_scale: bool = False,
              title: str | None = None, progress=None, model_note: str | None = None,
              trained: bool = True) -> dict:
    """The JSON the page's script draws: maps, labels, image, and the view and selection to open on.
    model_note: the model's note (ModelInfo.note), None for the built-in's by name; trained=False says the
    weights are random, as the window does."""
    view = check_view(view, r)
    L, H, N = _shape(r)
    layer, head = _in_range(layer, L, "layer"), _in_range(head, H, "head")
    m = page_maps(r, max_side, hide_special, progress)
    notes = page_notes(r, m, N, model_note, trained)
    if hide_special and not m.hidden_special and hidden_tokens(r.special) is not None:
        notes.insert(notes.index(next(n for n in notes if n.startswith("Weights stored"))) + 1, "Special tokens shown: hiding them applies to text runs shown one cell a token.")
    n = len(m.labels)
    q = _cell_of(m, default_query(r) if query is None else int(query), n)
    d = {
        "format": FORMAT, "version": VERSION,
        "title": title or f"{r.model}: {L} layers × {H} heads, {N} tokens",
        "model": str(r.model), "dk_scale": float(r.dk_scale),
        "layers": L, "heads": H, "tokens_total": N, "n": n,
        "labels": m.labels, "special": m.special, "token_index": [int(t) for t in m.tokens],
        "edges": None if m.edges is None else [int(e) for e in m.edges],
        "maps": {"encoding": "uint8-zlib-base64", "shape": [L, H, n, n], "levels": LEVELS,
                 "scale": np.round(m.scale.astype(np.float64), 9).tolist(), "data": pack(m.levels),
                 "row_scale": {"encoding": "float32le-zlib-base64", "data": pack(m.row_scale, np.float32)},
                 "prefix_scale": None if m.prefix_scale is None else
                 {"encoding": "float32le-zlib-base64", "data": pack(m.prefix_scale, np.float32)}},
        "image": None, "grid": None, "patch_offset": int(getattr(r, "patch_offset", 0) or 0),
        "view": view, "layer": layer, "head": head, "query": q, "log_scale": bool(log_scale),
        "notes": notes,
    }
    if r.grid is not None:
        d["grid"] = [int(r.grid[0]), int(r.grid[1])]
        if r.image is not None:
            img = np.ascontiguousarray(np.asarray(r.image, dtype=np.uint8)[..., :3])
            d["image"] = {"encoding": "rgb-zlib-base64", "shape": list(img.shape), "data": pack(img)}
    return d


def default_query(r) -> int:
    """[CLS] for images; for text the first token that is not special."""
    if r.grid is not None:
        return 0
    special = np.asarray(r.special, dtype=bool)
    idx = np.flatnonzero(~special)
    return int(idx[0]) if idx.size else 0


def _cell_of(m: PageMaps, token: int, n: int) -> int:
    """The cell that shows the run's token `token` (clamped)."""
    if m.edges is not None:
        return int(np.clip(np.searchsorted(m.edges, token, side="right") - 1, 0, n - 1))
    where = np.flatnonzero(m.tokens == token)
    return int(where[0]) if where.size else 0


def _in_range(v, n: int, what: str) -> int:
    v = int(v)
    if not 0 <= v < n:
        raise UserError(f"no {what} {v}: the run has {what}s 0..{n - 1}")
    return v


def check_view(view: str, r=None) -> str:
    """A view name the page draws; "overlay" only for image runs."""
    v = str(view).strip().lower()
    if v not in VIEWS:
        raise UserError(f"unknown view {view!r}: choose from {', '.join(VIEWS)}")
    if v == "overlay" and r is not None and r.grid is None:
        raise UserError("the overlay view is for image runs (a picture and its patches); this run is text")
    return v


def viewer_script() -> str:
    """The viewer's JavaScript (resources/html/viewer.js)."""
    return _read("viewer.js")


def viewer_style() -> str:
    return _read("viewer.css")


def _read(name: str) -> str:
    p = resource_path("html", name)
    try:
        return p.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"the page's {name} is missing from this installation ({p})") from e


def script_json(d: dict) -> str:
    """JSON safe inside a <script> element: "</" cannot close it early."""
    return json.dumps(d, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")


def page_html(r, view: str = "grid", layer: int = 0, head: int = 0, query: int | None = None,
              max_side: int = MAX_SIDE, hide_special: bool = False, log_scale: bool = False,
              title: str | None = None, progress=None, model_note: str | None = None,
              trained: bool = True) -> str:
    """The whole page of run r as one string: style, data and script inlined. progress(fraction,
    message): see `page_maps`; model_note, trained: see `page_data`."""
    d = page_data(r, view, layer, head, query, max_side, hide_special, log_scale, title, progress,
                  model_note, trained)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<meta name=\"generator\" content=\"attn-explorer\"><title>{html.escape(d['title'])}</title>"
        f"<style>{viewer_style()}</style></head>\n<body>"
        "<div class=\"ax-root\" data-ax-page=\"1\"></div>\n"
        f"<script type=\"application/json\" class=\"ax-data\">{script_json(d)}</script>\n"
        f"<script>{viewer_script()}\naxBoot(document.querySelector('.ax-root'), "
        "JSON.parse(document.querySelector('.ax-data').textContent));</script>\n"
        "</body></html>\n"
    )


def read_page_data(text: str) -> dict:
    """The data block of a page written by `page_html` (tests, and anyone who wants the numbers back)."""
    start = text.find('<script type="application/json" class="ax-data">')
    if start < 0:
        raise UserError("not an attn-explorer page: no data block")
    start = text.index(">", start) + 1
    end = text.index("</script>", start)
    d = json.loads(text[start:end].replace("<\\/", "</"))
    if d.get("format") != FORMAT:
        raise UserError("not an attn-explorer page")
    return d


def page_weights(d: dict) -> np.ndarray:
    """float32 (L, H, n, n) weights of a page's data block: level · row_scale / 255 (keys before the patches
    of an image run: · prefix_scale)."""
    m = d["maps"]
    q = unpack(m["data"], m["shape"]).astype(np.float32)
    s = np.repeat(unpack(m["row_scale"]["data"], m["shape"][:3], np.float32)[..., None], m["shape"][3], axis=-1)
    if m.get("prefix_scale"):
        off = int(d["patch_offset"])
        s[..., :off] = unpack(m["prefix_scale"]["data"], m["shape"][:3], np.float32)[..., None]
    return q * s / m["levels"]
