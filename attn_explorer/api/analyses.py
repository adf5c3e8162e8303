"""Your own analyses: `ax.register_analysis(name, fn, view=None)`, then see them in the window, the CLI and ax.show.

An analysis is a function `fn(result) -> array`: a RunResult in, a NumPy array out. Its shape says how it is
drawn (the view):

- "grid":   (L, H), one number per head of the run, drawn as a layer × head grid;
- "tokens": (N,), one number per token, drawn as a strip under the tokens;
- "map":    (N, N), a token × token map, or (rows, cols) of an image run's patch grid.

With view=None the shape decides, in that order (an (L, H) answer that is also (N, N) is a grid: pass
view="map" to say otherwise). Running an analysis (`run_analysis`) checks its answer: a finite numeric array
of a shape that fits the view and the run; anything else, or an exception inside fn, is one UserError line
that names the analysis.

An installed package can add analyses through the entry point group `attn_explorer.analyses`: each entry
point loads to a function (named as the entry point, its view inferred), or to `(fn, view)` or
`{"fn": fn, "view": view}`. They are read once per process, the first time the registry is used; one that
fails to load is kept as one line (`problems()`), never a crash.

Plain Python and NumPy only: the window lists the analyses through session/, and nothing here imports torch.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from attn_explorer.errors import UserError

VIEWS = ("grid", "tokens", "map")
ENTRY_POINT_GROUP = "attn_explorer.analyses"
# names `export --analysis` already gives to the analysis floor's own arrays: a registered one would be ambiguous
BUILT_IN = ("rollout", "norms", "stats", "relevance")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Analysis:
    """One registered analysis."""

    name: str
    fn: Callable[[Any], Any]
    view: str | None  # "grid", "tokens", "map", or None: the answer's shape decides
    source: str = "registered"  # "registered" (ax.register_analysis) or "entry point <package>"


@dataclass(frozen=True)
class AnalysisAnswer:
    """What one analysis answered for one run, checked: plain data, so it may cross into the GUI thread."""

    name: str
    values: np.ndarray  # the array fn returned (numeric, finite)
    view: str  # "grid" (L, H), "tokens" (N,) or "map" ((N, N), or an image run's (rows, cols))
    rows: list[str]  # a label per row of the drawing: layers "0".., the tokens, or patch rows "r0"..
    cols: list[str]  # a label per column: heads "0".., the tokens, or patch columns "c0"..


_registry: dict[str, Analysis] = {}
_problems: list[str] = []
_entry_points_read = False
_lock = threading.RLock()  # the window reads the registry in worker threads


def _check_name(name) -> str:
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"an analysis needs a name: a non-empty string such as 'prev_token'; got {name!r}")
    if not _NAME.match(name):
        raise UserError(f"analysis name {name!r} must start with a letter or _ and hold only letters, digits, "
                        "_ . or - (at most 64), such as 'prev_token'")
    if name.lower() in BUILT_IN:
        raise UserError(f"analysis name {name!r} is taken by a built-in analysis ({', '.join(BUILT_IN)}): "
                        "choose another")
    return name


def _check_view(view, name: str) -> str | None:
    if view is not None and view not in VIEWS:
        raise UserError(f"analysis {name!r}: view must be None (from the answer's shape) or one of "
                        f"{', '.join(map(repr, VIEWS))}; got {view!r}")
    return view


def _add(name, fn, view, source: str) -> Analysis:
    name = _check_name(name)
    if not callable(fn):
        raise UserError(f"analysis {name!r}: fn must be a function of a RunResult returning an array; "
                        f"got {type(fn).__name__}")
    a = Analysis(name, fn, _check_view(view, name), source)
    with _lock:
        _registry[name] = a  # registering a name again replaces it
    return a


def register_analysis(name: str, fn: Callable[[Any], Any], view: str | None = None) -> Callable[[Any], Any]:
    """Register `fn(result) -> array` as analysis `name`, drawn as `view` ("grid", "tokens", "map"; None:
    from the answer's shape). Registering a name again replaces it. Returns fn."""
    load_entry_points()  # first, so that a name registered here replaces an installed one, not the other way
    _add(name, fn, view, "registered")
    return fn


def unregister_analysis(name: str) -> None:
    """Forget analysis `name` (nothing happens when there is none)."""
    with _lock:
        _registry.pop(name, None)


def analyses() -> list[str]:
    """The names of the registered analyses (yours and installed packages'), in the order registered."""
    load_entry_points()
    with _lock:
        return list(_registry)


def catalogue() -> list[tuple[str, str | None]]:
    """(name, view or None) of every registered analysis, for the window's chooser."""
    load_entry_points()
    with _lock:
        return [(a.name, a.view) for a in _registry.values()]


def problems() -> list[str]:
    """One line for each installed entry point that could not be read."""
    load_entry_points()
    with _lock:
        return list(_problems)


def get_analysis(name: str) -> Analysis:
    """The registered analysis `name`; an unknown name is one line listing the known ones."""
    load_entry_points()
    with _lock:
        a = _registry.get(name)
        known = list(_registry)
        broken = [p for p in _problems if f"{name!r}" in p]
    if a is None:
        if broken:
            raise UserError(broken[0])
        have = f"registered: {', '.join(known)}" if known else "none is registered: call ax.register_analysis(name, fn)"
        raise UserError(f"unknown analysis {name!r} ({have})")
    return a


# ---- installed packages -------------------------------------------------------------------------------------

def load_entry_points(force: bool = False) -> None:
    """Read the `attn_explorer.analyses` entry points once per process (again with force=True). Each loads to
    a function, (fn, view) or {"fn": fn, "view": view}; one that fails is one line in `problems()`."""
    global _entry_points_read
    with _lock:
        if _entry_points_read and not force:
            return
        _entry_points_read = True
        if force:
            _problems.clear()
        from importlib.metadata import entry_points

        try:
            found = list(entry_points(group=ENTRY_POINT_GROUP))
        except Exception as e:  # a damaged installation's metadata: say so, do not crash
            _problems.append(f"could not list the {ENTRY_POINT_GROUP} entry points: {_one_line(e)}")
            return
        for ep in found:
            package = getattr(getattr(ep, "dist", None), "name", None) or ep.value
            try:
                obj = ep.load()
                fn, view = _unpack(obj)
                if ep.name in _registry and _registry[ep.name].source == "registered":
                    continue  # registered in this process before the entry points were read: that one wins
                _add(ep.name, fn, view, f"entry point {package}")
            except Exception as e:  # anything a broken package raises: one line, and the rest still load
                _problems.append(f"analysis {ep.name!r} from {package} ({ep.value}) could not be loaded: "
                                 f"{_one_line(e)}")


def _unpack(obj) -> tuple[Any, Any]:
    if isinstance(obj, dict):
        if "fn" not in obj:
            raise UserError("the entry point's dict has no 'fn'")
        return obj["fn"], obj.get("view")
    if isinstance(obj, (tuple, list)):
        if len(obj) != 2:
            raise UserError(f"the entry point's tuple must be (fn, view); it has {len(obj)} items")
        return obj[0], obj[1]
    return obj, None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return first if isinstance(e, UserError) else f"{type(e).__name__}: {first}" if first else type(e).__name__


# ---- running one --------------------------------------------------------------------------------------------

def run_analysis(name: str, result) -> AnalysisAnswer:
    """Run analysis `name` on a RunResult and check its answer (a finite numeric array whose shape fits the
    view and this run); a bad answer, or an exception in fn, is one UserError line naming the analysis."""
    a = get_analysis(name)
    try:
        out = a.fn(result)
    except Exception as e:
        raise UserError(f"analysis {name!r} failed: {_one_line(e)}") from e
    return check_answer(name, out, result, a.view)


def check_answer(name: str, out, result, view: str | None = None) -> AnalysisAnswer:
    """`out` as an AnalysisAnswer for `result`, or one UserError line saying what is wrong with it."""
    try:
        values = np.asarray(out)
    except Exception as e:
        raise UserError(f"analysis {name!r} returned {type(out).__name__}, not an array: {_one_line(e)}") from e
    if values.dtype.kind not in "biuf":
        raise UserError(f"analysis {name!r} returned an array of {values.dtype} ({type(out).__name__}); "
                        "it must be numbers (int or float)")
    L, H = (int(s) for s in result.attentions.shape[:2])
    N = len(result.tokens)
    grid = tuple(int(s) for s in result.grid) if result.grid is not None else None
    fits = {"grid": [(L, H)], "tokens": [(N,)], "map": [(N, N)] + ([grid] if grid else [])}
    if view is None:
        view = next((v for v in VIEWS if values.shape in fits[v]), None)
    if view is None or values.shape not in fits[view]:
        want = " or ".join(str(s) for s in fits[view]) if view else \
            f"(L, H) = ({L}, {H}), (N,) = ({N},) or (N, N) = ({N}, {N})" + (f" or the patch grid {grid}" if grid else "")
        how = f"for view {view!r} " if view else ""
        raise UserError(f"analysis {name!r} returned shape {values.shape}; {how}this run "
                        f"({L} layers × {H} heads, {N} tokens) needs {want}")
    if values.size and not np.isfinite(values.astype(np.float64, copy=False)).all():
        bad = int(values.size - np.isfinite(values.astype(np.float64, copy=False)).sum())
        raise UserError(f"analysis {name!r} returned {bad} value(s) that are NaN or infinite; every value must "
                        "be a finite number")
    rows, cols = _labels(view, values.shape, result)
    return AnalysisAnswer(name, values, view, rows, cols)


def _labels(view: str, shape: tuple, r) -> tuple[list[str], list[str]]:
    if view == "grid":
        return [str(i) for i in range(shape[0])], [str(i) for i in range(shape[1])]
    tokens = [str(t) for t in r.tokens]
    if view == "tokens":
        return [], tokens
    if r.grid is not None and shape == tuple(r.grid) and shape != (len(tokens), len(tokens)):
        return [f"r{i}" for i in range(shape[0])], [f"c{j}" for j in range(shape[1])]
    return tokens, tokens
