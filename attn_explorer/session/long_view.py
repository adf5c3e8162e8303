"""Long inputs in the window: what the one-head view, its query strip and the grid ask the worker lanes for.

A long input's maps are not kept (RunResult.is_lazy): every part of a head's map is computed exactly, when a
view asks, from each layer's q and k (`RunResult.attention`). A screen has far fewer pixels than such a map
has cells, so a view asks for what it draws: the visible window of rows × columns, pooled to at most its
pixels (max of the exact probabilities, so one sharp weight stays visible), and the selected query's row
pooled to the strip's width. The job functions here run in worker lanes (`state.submit(..., key=...)`,
newest wins); what comes back is small NumPy arrays and plain data, tagged with the request that made them
so a view can drop an answer that no longer matches what it shows.

`colour_scale` (NumPy only) is the colour rule every view applies on the GUI thread to what came back:
plain weights, each row scaled to its own maximum, or a percentile clip with attention sinks left apart.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from attn_explorer.maths import LOG_FLOOR, log_weights, pool2d, pool_edges

# a dense result longer than this is drawn windowed too (a lazy one always is): beyond it the full n×n image
# costs more to upload and hover than the window a screen can show
WINDOWED_FROM = 2048
WINDOW_LANE = "long-window"  # the one-head view's visible window (zoom and pan: newest wins)
STRIP_LANE = "long-strip"  # the selected query's row over the whole text
GRID_LANE = "long-grid"  # the overview of every head, filled in layer by layer
TOP_KEYS = 6  # keys named in the strip's read-out

COLOUR_SCALES = ("weight", "row", "clip")
COLOUR_NAMES = {"weight": "weight", "row": "per row (each row ÷ its max)", "clip": "99th pct clip, sinks apart"}
CLIP_PCT = 99.0
SINK_SHARE = 0.25  # a key column whose mean weight over the rows shown is above this is a sink
SINK_FLOOR, SINK_RATIO = 0.05, 8.0  # or above this and that many times the median column's mean
SINK_MAX = 4  # most columns left apart


def windowed(r: Any, stack: str = "encoder") -> bool:
    """Whether the one-head view draws r through the window lane (pooled, asked again on zoom) rather than
    from the whole map at once: every lazy result, and dense ones longer than WINDOWED_FROM tokens."""
    if r is None or stack != "encoder":
        return False
    return bool(getattr(r, "is_lazy", False)) or r.num_tokens > WINDOWED_FROM


def result_tag(r: Any) -> int:
    """What identifies the run an answer came from: its maps' store, which a redraw of the same run (hide
    specials, another stack: a new record sharing the arrays) keeps, and a newer run replaces."""
    lazy = getattr(r, "lazy", None)
    return id(lazy if lazy is not None else r.attentions)


def layer_key(r: Any, layer: int) -> Any:
    """What identifies the computation behind layer `layer` of a lazy run r: a weak reference to its kept q. A
    long run's parts (session.live_run, one a finished layer) and the finished run share their layers' q, so a
    view of a finished layer keeps what it drew while later layers arrive (issue 24 C). None: the layer is not
    computed yet, or r keeps its maps (a dense run: result_tag says which run it is)."""
    import weakref

    layers = getattr(getattr(r, "lazy", None), "layers", None)
    if layers is None or not 0 <= int(layer) < len(layers):
        return None
    q = getattr(layers[int(layer)], "q", None)
    try:
        return weakref.ref(q) if q is not None else None
    except TypeError:
        return None


def same_layer(key: Any, r: Any, layer: int) -> bool:
    """Whether layer `layer` of r is the very computation `key` (layer_key) was taken from."""
    now = layer_key(r, layer)
    return key is not None and now is not None and key() is not None and key() is now()


# ------------------------------------------------------------------------------------------ requests
@dataclass(frozen=True)
class WindowAsk:
    """One window of one head's map: rows [r0, r1) × columns [c0, c1), pooled to at most cells (rows, cols)."""

    tag: int  # result_tag of the run
    layer: int
    head: int
    rows: tuple[int, int]
    cols: tuple[int, int]
    cells: tuple[int, int]

    @property
    def full(self) -> bool:
        """Every cell of the window is one token pair (no pooling)."""
        return self.cells[0] >= self.rows[1] - self.rows[0] and self.cells[1] >= self.cols[1] - self.cols[0]


@dataclass(frozen=True)
class Window:
    """The answer to a WindowAsk: values (r, c) float32, cell (i, j) covering the rows and columns given by
    row_edges[i]..row_edges[i+1] and col_edges[j]..col_edges[j+1] (token indices)."""

    ask: WindowAsk
    values: np.ndarray
    row_edges: np.ndarray
    col_edges: np.ndarray
    ms: float = 0.0

    @property
    def pooled(self) -> bool:
        return self.values.shape != (self.ask.rows[1] - self.ask.rows[0], self.ask.cols[1] - self.ask.cols[0])


@dataclass(frozen=True)
class Strip:
    """One query's whole row, pooled to `values.shape[0]` cells (max), and the keys it reads most."""

    tag: int
    layer: int
    head: int
    query: int
    values: np.ndarray  # (w,) float32: cell j covers keys edges[j]..edges[j+1]
    edges: np.ndarray
    top: list[tuple[int, float]] = field(default_factory=list)  # (key, exact weight), strongest first
    total: int = 0  # keys in the row


def visible_ask(r: Any, layer: int, head: int, x_range, y_range, pixels: tuple[int, int]) -> WindowAsk:
    """The window a view shows: its x (columns) and y (rows) range in token units, widened to whole tokens and
    clamped to the map, asked at most one cell per pixel (pixels = (rows, cols) of the view box)."""
    n = r.num_tokens
    R = n  # square maps: the encoder's self-attention (every windowed result)

    def span(lo_hi, size):
        lo, hi = sorted(float(v) for v in lo_hi)
        a = int(max(0, min(size - 1, np.floor(lo))))
        b = int(max(a + 1, min(size, np.ceil(hi))))
        return a, b

    rows, cols = span(y_range, R), span(x_range, n)
    cells = (max(1, min(rows[1] - rows[0], int(pixels[0]))), max(1, min(cols[1] - cols[0], int(pixels[1]))))
    return WindowAsk(result_tag(r), int(layer), int(head), rows, cols, cells)


# ------------------------------------------------------------------------------------------ jobs
def _torch_threads() -> None:
    from attn_explorer.session.torch_setup import configure_torch

    configure_torch()


def window_job(r: Any, ask: WindowAsk) -> Window:
    """The window `ask` of r's head, pooled (max) to its cells: RunResult.attention, in a worker."""
    from attn_explorer.maths import pool_edges

    _torch_threads()
    t0 = time.perf_counter()
    values = r.attention(ask.layer, ask.head, rows=ask.rows, cols=ask.cols,
                         pool=None if ask.full else ask.cells, reduce="max")
    re = ask.rows[0] + pool_edges(ask.rows[1] - ask.rows[0], ask.cells[0])
    ce = ask.cols[0] + pool_edges(ask.cols[1] - ask.cols[0], ask.cells[1])
    return Window(ask, np.ascontiguousarray(values, dtype=np.float32), re, ce, (time.perf_counter() - t0) * 1000)


def strip_job(r: Any, layer: int, head: int, query: int, width: int, top: int = TOP_KEYS) -> Strip:
    """Query `query`'s row of head (layer, head), max-pooled to `width` cells, and its `top` strongest keys."""
    _torch_threads()
    row = r.attention(layer, head, rows=int(query))  # (N,): one row, exact
    return strip_of_row(row, width, result_tag(r), layer, head, query, top)


def overview_cell(n: int, cell_max: int) -> int:
    """Side of one head's cell in the grid's mosaic: every token when they fit, else cell_max."""
    return max(1, min(int(n), int(cell_max)))


def reused_prefix(r: Any) -> int:
    """Tokens r's run took over from the run before (Model.run(reuse_prefix=True): RunResult.reuse reads
    "reused 28,252 of 28,253 tokens"); 0 when none."""
    m = re.match(r"reused ([\d,]+) of", str(getattr(r, "reuse", "") or ""))
    return int(m.group(1).replace(",", "")) if m else 0


def overview_job(r: Any, cell_max: int = 128, stack: str = "encoder",
                 previous: tuple | None = None) -> Iterator[tuple[int, int, Any]]:
    """The grid's mosaic of a long (lazy) result, filled in head by head in a worker: yields (heads done,
    heads in all, api.display.GridImage so far; heads not yet done are NaN, drawn blank, so a head still to come
    is not mistaken for one with no weight). Each head is its map max-pooled
    to c×c cells from the exact probabilities (RunResult.attention), so no n×n map is ever held.

    previous: (GridImage, tokens) of the complete overview of the run before, when r reused its prefix
    (reused_prefix > 0; a causal model: rows before the first changed token are unchanged, their columns after
    it 0). If that overview has r's length and shape, each head's cells above the cell row the first changed
    token falls in are copied from it, and only the rows from that cell row on are computed (at one row a
    cell, then max-pooled into the same cells): an edit near the end costs its rows, not every head again."""
    from attn_explorer.api.display import GridImage

    _torch_threads()
    L, H = r.attentions.shape[:2]
    n = r.num_tokens
    c = overview_cell(n, cell_max)
    sinks = getattr(r, "sinks", None) if stack == "encoder" else None  # gpt-oss: a sink column left of each cell
    lead = 0 if sinks is None else 1
    mosaic = np.full((L * c, H * (c + lead)), np.nan, np.float32)
    total, done, shown = L * H, 0, time.perf_counter()

    def image() -> GridImage:
        w = mosaic.copy()
        return GridImage(weights=w, log_weights=log_weights(w), layers=L, heads=H, cell=c, stack=stack,
                         cell_cols=c + lead if lead else 0)

    w = c + lead
    edges = pool_edges(n, c)
    keep = _kept_cells(previous, mosaic.shape, n, c, reused_prefix(r), edges) if stack == "encoder" else 0
    store = getattr(r, "lazy", None)  # issue 25: a hybrid's narrower layers have fewer heads (left NaN: blank)
    for layer in range(L):
        for head in range(H):
            if store is not None and head >= getattr(store.layers[layer], "heads", H):
                done += 1
                if done == total:
                    yield done, total, image()
                continue
            if lead:
                mosaic[layer * c:(layer + 1) * c, head * w] = pool2d(sinks[layer, head][:, None], c, 1, "max")[:, 0]
            cells = mosaic[layer * c:(layer + 1) * c, head * w + lead:(head + 1) * w]
            if keep:  # issue 24: the cells above the edit are the previous overview's; the rest from its rows
                old = previous[0].weights[layer * c:(layer + 1) * c, head * w:(head + 1) * w]
                mosaic[layer * c:layer * c + keep, head * w:(head + 1) * w] = old[:keep]
                start = int(edges[keep])
                rows = r.attention(layer, head, rows=(start, n), pool=(n - start, c))  # one row a cell
                cells[keep:] = np.maximum.reduceat(rows, edges[keep:-1] - start, axis=0)
            else:
                cells[:] = r.attention(layer, head, pool=c)
            done += 1
            now = time.perf_counter()
            if done == total or now - shown > 0.25:  # a few frames a second: copying the mosaic is not free
                shown = now
                yield done, total, image()


def _kept_cells(previous: tuple | None, shape: tuple, n: int, c: int, p: int, edges: np.ndarray) -> int:
    """How many cell rows of each head overview_job may copy from `previous` (0: compute every head anew)."""
    if previous is None or p <= 0:
        return 0
    grid, old_n = previous
    weights = getattr(grid, "weights", None)
    if old_n != n or weights is None or weights.shape != shape or getattr(grid, "cell", c) != c:
        return 0  # another length moves every cell's edges
    if np.isnan(weights).any():
        return 0  # an overview stopped half-way
    return int(np.searchsorted(edges, p, side="right")) - 1  # cell rows wholly before token p


# ------------------------------------------------------------------------------------------ colour
@dataclass(frozen=True)
class Scaled:
    """What to draw: values, their colour levels, the colour bar's title, and the sink columns left apart."""

    values: np.ndarray
    levels: tuple[float, float]
    label: str
    sinks: np.ndarray = field(default_factory=lambda: np.zeros(0, int))  # column indices (of `values`)
    sink_share: float = 0.0  # their mean weight over the rows shown


def sink_columns(values: np.ndarray, share: float = SINK_SHARE) -> np.ndarray:
    """Attention sinks among the columns shown (BOS, the first token): columns whose mean weight over the rows
    is above `share`, or, in a window where weights are small, above SINK_FLOOR and SINK_RATIO times the
    median column's (key 0 taking a tenth of every row while the others take a thousandth); SINK_MAX at most,
    the strongest."""
    v = np.asarray(values, dtype=np.float32)
    if v.ndim == 1:
        v = v[None]
    if v.size == 0:
        return np.zeros(0, int)
    means = np.nan_to_num(v.mean(axis=0))
    typical = float(np.median(means))
    sink = (means > share) | ((means > SINK_FLOOR) & (means > SINK_RATIO * typical))
    found = np.flatnonzero(sink)
    if found.size > SINK_MAX:  # many strong columns are a pattern, not a sink: keep only the strongest
        found = np.sort(found[np.argsort(-means[found], kind="stable")[:SINK_MAX]])
    return found


def colour_scale(values: np.ndarray, mode: str, log: bool) -> Scaled:
    """values (rows × cols, or one row) coloured by `mode`:

    - "weight": the weights themselves, 0..1 (log10 on the log scale), comparable across heads;
    - "row": each row divided by its own maximum, so a row that spreads its weight is as bright as one
      that gives nearly all of it to a sink;
    - "clip": 0 up to the 99th percentile of the weights outside the sink columns (which are left blank,
      NaN: transparent) so a sink does not leave the rest of the map one dark colour.
    """
    if mode not in COLOUR_SCALES:
        raise ValueError(f"colour scale must be one of {', '.join(COLOUR_SCALES)}, not {mode!r}")
    v = np.asarray(values, dtype=np.float32)
    if mode == "weight":
        if log:
            return Scaled(log_weights(v), (LOG_FLOOR, 0.0), "log₁₀ weight")
        return Scaled(v, (0.0, 1.0), "weight")
    if mode == "row":
        top = v.max(axis=-1, keepdims=True) if v.size else v
        out = np.divide(v, top, out=np.zeros_like(v), where=top > 0)
        if log:
            return Scaled(log_weights(out), (LOG_FLOOR, 0.0), "log₁₀ (weight ÷ its row's max)")
        return Scaled(out, (0.0, 1.0), "weight ÷ its row's max")
    sinks = sink_columns(v)
    rest = np.delete(v, sinks, axis=-1) if sinks.size else v
    top = float(np.percentile(rest, CLIP_PCT)) if rest.size else 0.0
    if not top > 0:
        top = float(rest.max()) if rest.size and rest.max() > 0 else 1e-6
    share = float(v[..., sinks].mean()) if sinks.size else 0.0
    out = v.copy()
    if sinks.size:
        out[..., sinks] = np.nan
    apart = ", sinks apart" if sinks.size else ""
    if log:
        hi = float(np.log10(top))
        lo = hi - 4.0
        with np.errstate(invalid="ignore"):
            return Scaled(np.log10(np.maximum(out, np.float32(10.0 ** lo))), (lo, hi),
                          f"log₁₀ weight (top: {CLIP_PCT:g}th pct{apart})", sinks, share)
    return Scaled(out, (0.0, top), f"weight (0 to {CLIP_PCT:g}th pct{apart})", sinks, share)


def sink_colours(sink: np.ndarray, matrix: np.ndarray | None, mode: str, log: bool) -> tuple[Scaled | None, np.ndarray]:
    """gpt-oss's sink column beside a map, coloured like it: (the map's Scaled, or None without a map; the
    sink's values (R,) on the same levels). "weight": both as they are; "row": each row (its keys and its sink
    together) over its own max; "clip": the map's own clip (colour_scale), the sink drawn at most at its top
    (a sink above the clip is as bright as the scale goes). Without a map (a long input's pooled view) the
    sink alone is coloured as weights, or within the map's clip."""
    s = np.asarray(sink, dtype=np.float32)
    if matrix is not None and mode in ("weight", "row"):
        both = colour_scale(np.concatenate([s[:, None], np.asarray(matrix, dtype=np.float32)], axis=1), mode, log)
        return Scaled(both.values[:, 1:], both.levels, both.label), both.values[:, 0]
    if matrix is not None:
        top = colour_scale(matrix, mode, log)
        hi = top.levels[1]
        with np.errstate(divide="ignore"):
            v = np.log10(np.maximum(np.minimum(s, 10.0 ** hi), 10.0 ** top.levels[0])) if log else np.minimum(s, hi)
        return top, v.astype(np.float32)
    return None, colour_scale(s[:, None], "weight", log).values[:, 0]


def sink_text(sink: np.ndarray | None, query: int | None = None, token: str = "") -> str:
    """What a head gives its learned sink (gpt-oss), in words: its rows' mean share, and the query's own."""
    if sink is None or not len(sink):
        return ""
    s = np.asarray(sink, dtype=np.float64)
    out = f"this head gives its learned sink {s.mean():.0%} of each row's weight on average (max {s.max():.0%})"
    if query is not None and 0 <= query < len(s):
        out += f"; query {query} {token!r}: {s[query]:.0%}"
    return out


# ------------------------------------------------------------------------------------------ go to token
def _plain(token: str) -> str:
    """A token as a user types it: the tokenizer's word-start marks (Ġ, ▁, ##) and spaces dropped, lower case."""
    return token.replace("Ġ", "").replace("▁", "").replace("##", "").strip().lower()


def find_token(tokens: list[str], wanted: str, after: int = -1) -> int:
    """The token a "Go to token" box names: a number (its index), or a word (the next token after `after`
    that is that word, else the next that contains it, wrapping round). One UserError line when there is none."""
    from attn_explorer.errors import UserError

    text = str(wanted).strip()
    n = len(tokens)
    if not text:
        raise UserError("type a token number or a word to go to")
    if text.lstrip("#").isdigit():
        i = int(text.lstrip("#"))
        if not 0 <= i < n:
            raise UserError(f"there is no token {i:,}: the input has tokens 0 to {n - 1:,}")
        return i
    word = _plain(text)
    plain = [_plain(t) for t in tokens]
    order = [(after + 1 + k) % n for k in range(n)] if n else []
    for match in (lambda t: t == word, lambda t: word in t):
        for i in order:
            if plain[i] and match(plain[i]):
                return i
    raise UserError(f'no token "{text}" in the input ({n:,} tokens)')


def strip_of_row(row: np.ndarray, width: int, tag: int, layer: int, head: int, query: int,
                 top: int = TOP_KEYS) -> Strip:
    """A Strip from one query's whole row (N,) already at hand (a short input's dense map), pooled as
    strip_job pools it."""
    from attn_explorer.maths import pool_edges

    row = np.asarray(row, dtype=np.float32)
    n = row.shape[0]
    edges = pool_edges(n, max(1, int(width)))
    values = np.maximum.reduceat(row, edges[:-1]) if n else row
    k = min(top, n)
    best = np.argpartition(-row, k - 1)[:k] if k else np.zeros(0, int)
    best = best[np.argsort(-row[best], kind="stable")]
    return Strip(tag, int(layer), int(head), int(query), values.astype(np.float32), edges,
                 [(int(j), float(row[j])) for j in best], n)


FOCUS_LANE = "long-focus"  # the token-focus and overlay pages: one query's row in every head asked


@dataclass(frozen=True)
class QueryRows:
    """One query's rows in the heads asked: values (len(layers)·H, N) float32, layer by layer."""

    tag: int
    query: int
    layers: tuple[int, ...]
    values: np.ndarray


def query_rows_job(r: Any, query: int, layers: tuple[int, ...] | None = None) -> QueryRows:
    """Query `query`'s row of every head in `layers` (every layer when None), exact, in a worker: what the
    token-focus page (every head) and the patch overlay (one layer) draw of a long input."""
    _torch_threads()
    L, H = r.attentions.shape[:2]
    layers = tuple(range(L)) if layers is None else tuple(int(l) for l in layers)
    n = r.attentions.shape[-1]
    out = np.empty((len(layers) * H, n), np.float32)
    for a, layer in enumerate(layers):
        for h in range(H):
            out[a * H + h] = r.attention(layer, h, rows=int(query))
    return QueryRows(result_tag(r), int(query), layers, out)
