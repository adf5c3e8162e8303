"""The .axsession file: what the window needs to come back to the same view tomorrow.

A session is a small JSON file. It names the model (its source as `load_model` takes it: a built-in
name, a folder, a hub id; the dtype; the device preference), the input (the text, or the image's path
with the sha256 of its bytes), the selection (layer, head, query token), the sliders (d_k and whether it
acts on one layer, the token cut, the image size), the page shown and the view options. It holds no
maps: opening it runs the model again on the same input, so the maps are the model's own.

`snapshot` reads a session out of the state, `write_session` saves it atomically, `read_session`
checks a file field by field and refuses a damaged, foreign or newer one with one UserError line, and
`image_problem` says in one line when the image changed or went since the session was saved.
`restore` puts a session into the state, and `open_session` / `open_result` are how the state comes back
to a saved session (loading its model first when needed) or shows a saved run (.npz, `reopen.SavedRun`)
without its model. Qt-free: the state is read and written through its attributes and signals only.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write
from attn_explorer.validate import MAX_TEXT_BYTES

FORMAT = "attn-explorer session"  # the file's "format" field: tells a session from any other JSON
VERSION = 1  # the newest format this code reads and writes
SUFFIX = ".axsession"
# a session is a few kB plus its text (at most validate.MAX_TEXT_BYTES, which JSON may escape to twice that)
MAX_BYTES = 2 * MAX_TEXT_BYTES + 1_000_000
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class SavedSession:
    """One session, as plain data (the JSON file's fields)."""

    model: str  # load_model's source: built-in name, absolute folder path, .safetensors file or hub id
    dtype: str = "float32"
    device: str = "auto"  # the device preference the session ran with (auto, cpu, cuda, mps)
    input_kind: str = "text"  # "text" or "image"
    text: str = ""
    target: str = ""  # encoder-decoders: the decoder's text
    image_path: str | None = None  # absolute path of the image file
    image_sha256: str | None = None  # hex digest of its bytes when saved
    layer: int = 0
    head: int = 0
    query: int = 0
    query_chosen: bool = False  # the user picked the query (else the default query of the run is used)
    dk_scale: float = 1.0
    dk_layer_only: bool = False
    max_tokens: int | None = None
    image_size: int | None = None
    page: str = ""  # the window's page name ("" = leave it)
    view: dict[str, Any] = field(default_factory=dict)  # colormap, log_scale, hide_special, alpha, stack
    version: int = VERSION

    def to_json(self) -> dict:
        d = asdict(self)
        version = d.pop("version")
        return {"format": FORMAT, "version": version, "model": {"source": d.pop("model"), "dtype": d.pop("dtype"),
                                                                "device": d.pop("device")},
                "input": {"kind": d.pop("input_kind"), "text": d.pop("text"), "target": d.pop("target"),
                          "image_path": d.pop("image_path"), "image_sha256": d.pop("image_sha256")},
                "selection": {"layer": d.pop("layer"), "head": d.pop("head"), "query": d.pop("query"),
                              "query_chosen": d.pop("query_chosen")},
                "sliders": {"dk_scale": d.pop("dk_scale"), "dk_layer_only": d.pop("dk_layer_only"),
                            "max_tokens": d.pop("max_tokens"), "image_size": d.pop("image_size")},
                "page": d.pop("page"), "view": d.pop("view")}


# ------------------------------------------------------------------------------------------- writing
def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_source(name: str) -> str:
    """A model's name as a session stores it: a folder or file that exists becomes its absolute path (the
    session may be opened from another working folder); a built-in name or hub id stays as it is."""
    p = Path(name).expanduser()
    return str(p.resolve()) if p.exists() else name


def view_options(state: Any) -> dict[str, Any]:
    """The state's view options (session.inputs.VIEW_OPTIONS: colormap, log scale, hide specials, ...)."""
    from attn_explorer.session.inputs import VIEW_OPTIONS

    return {k: getattr(state, k) for k in VIEW_OPTIONS if isinstance(getattr(state, k, None), (str, bool, int, float))}


def snapshot(state: Any, page: str = "") -> SavedSession:
    """The session of `state` (session.state.SessionState) now, on window page `page`. Refused with one
    line when there is nothing to reopen: no model, or an image that is not a file (a pasted picture)."""
    info = getattr(state, "info", None)
    if info is None or not state.has_model:
        raise UserError("nothing to save yet: a session needs a loaded model (a saved run opened without "
                        "its model cannot be run again)")
    s = SavedSession(model=model_source(info.name), dtype=info.dtype, device=str(state.device or "auto"),
                     input_kind=state.input_kind, text=str(state.text), target=str(state.target),
                     layer=int(state.layer), head=int(state.head), query=int(state.query),
                     query_chosen=bool(state._query_chosen), dk_scale=float(state.dk_scale),
                     dk_layer_only=bool(state.dk_layer_only),
                     max_tokens=None if state.max_tokens is None else int(state.max_tokens),
                     image_size=None if state.image_size is None else int(state.image_size), page=str(page or ""),
                     view=view_options(state))
    if s.input_kind == "image":
        image = state.image
        if not isinstance(image, str) or not Path(image).is_file():
            raise UserError("this image is not a file (a pasted or generated picture): save it as a file and "
                            "open that, so the session can name it")
        s.image_path = str(Path(image).resolve())
        s.image_sha256 = file_sha256(image)
    return s


def write_session(s: SavedSession, path: str | os.PathLike) -> Path:
    """Save s as JSON at path, atomically (a temporary file renamed into place)."""
    text = json.dumps(s.to_json(), indent=1, ensure_ascii=False)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text + "\n")

    return atomic_write(path, write)


# ------------------------------------------------------------------------------------------- reading
def read_session(path: str | os.PathLike) -> SavedSession:
    """The session in file `path`, every field checked. A missing, damaged, foreign or newer file is one
    UserError line naming the file and what is wrong with it."""
    p = Path(path)
    name = p.name
    try:
        if p.is_dir():
            raise UserError(f"{p} is a folder, not a session file")
        if p.stat().st_size > MAX_BYTES:
            raise UserError(f"{name} is larger than {MAX_BYTES / 1e6:g} MB: not a session file")
        raw = p.read_bytes()
    except FileNotFoundError:
        raise UserError(f"session file not found: {p}") from None
    except OSError as e:
        raise UserError(f"cannot read {p}: {e.strerror or e}") from None
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{name} is damaged: not valid JSON ({e.__class__.__name__}: {e})") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise UserError(f"{name} is not an attn-explorer session (it has no \"format\": \"{FORMAT}\")")
    version = d.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UserError(f"{name} is damaged: its format version {version!r} is not a positive whole number")
    if version > VERSION:
        raise UserError(f"{name} was saved by a newer attn-explorer (session format {version}; this one reads "
                        f"up to {VERSION}): update attn-explorer to open it")
    try:
        return _parse(d)
    except _Bad as e:
        raise UserError(f"{name} is damaged: {e}") from None


class _Bad(Exception):
    """One field of a session file is missing or wrong (the message says which)."""


def _section(d: dict, key: str) -> dict:
    v = d.get(key)
    if not isinstance(v, dict):
        raise _Bad(f"\"{key}\" is missing or not an object")
    return v


def _get(sec: dict, where: str, key: str, kind, default=..., check=None):
    """sec[key] of type kind (a type or tuple), or default when absent; check(v) -> bool for its range."""
    if key not in sec or sec[key] is None:
        if default is ...:
            raise _Bad(f"{where}.{key} is missing")
        return default
    v = sec[key]
    ok = isinstance(v, kind) and not (isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)))
    if ok and check is not None:
        try:
            ok = bool(check(v))
        except (TypeError, ValueError):
            ok = False
    if not ok:
        raise _Bad(f"{where}.{key} = {v!r:.60} is not valid")
    return v


def _parse(d: dict) -> SavedSession:
    m, i, sel, sl = (_section(d, k) for k in ("model", "input", "selection", "sliders"))
    nonneg = lambda v: v >= 0  # noqa: E731
    s = SavedSession(
        model=_get(m, "model", "source", str, check=lambda v: v.strip() != ""),
        dtype=_get(m, "model", "dtype", str, "float32", check=lambda v: v in DTYPES),
        device=_get(m, "model", "device", str, "auto"),
        input_kind=_get(i, "input", "kind", str, check=lambda v: v in ("text", "image")),
        text=_get(i, "input", "text", str, ""),
        target=_get(i, "input", "target", str, ""),
        image_path=_get(i, "input", "image_path", str, None),
        image_sha256=_get(i, "input", "image_sha256", str, None,
                          check=lambda v: len(v) == 64 and all(c in "0123456789abcdef" for c in v)),
        layer=_get(sel, "selection", "layer", int, 0, nonneg),
        head=_get(sel, "selection", "head", int, 0, nonneg),
        query=_get(sel, "selection", "query", int, 0, nonneg),
        query_chosen=_get(sel, "selection", "query_chosen", bool, False),
        dk_scale=float(_get(sl, "sliders", "dk_scale", (int, float), 1.0,
                            lambda v: math.isfinite(v) and 0 < v <= 1000)),
        dk_layer_only=_get(sl, "sliders", "dk_layer_only", bool, False),
        max_tokens=_get(sl, "sliders", "max_tokens", int, None, lambda v: v >= 1),
        image_size=_get(sl, "sliders", "image_size", int, None, lambda v: 1 <= v <= 100_000),
        page=_get(d, "session", "page", str, ""),
        view=_view(d.get("view", {})),
        version=int(d["version"]),
    )
    if s.input_kind == "image" and (s.image_path is None or s.image_sha256 is None):
        raise _Bad("an image session needs input.image_path and input.image_sha256")
    if s.input_kind == "text" and not s.text.strip():
        raise _Bad("input.text is empty")
    return s


def _view(v: Any) -> dict:
    """The view options: names to plain values (each is checked against the state when restored)."""
    if not isinstance(v, dict):
        raise _Bad("\"view\" is not an object")
    for key, value in v.items():
        if not isinstance(value, (str, bool, int, float)) or (isinstance(value, float) and not math.isfinite(value)):
            raise _Bad(f"view.{key} = {value!r:.60} is not valid")
    if "alpha" in v and (isinstance(v["alpha"], (bool, str)) or not 0 <= v["alpha"] <= 1):
        raise _Bad(f"view.alpha = {v['alpha']!r:.60} is not valid")
    return dict(v)


# ------------------------------------------------------------------------------------------- problems
def image_problem(s: SavedSession) -> str:
    """One line when the session's image is not as it was saved ("" when it is, or for text): gone (the
    session cannot be opened: raised), or changed (the session opens the image as it is now, labelled)."""
    if s.input_kind != "image":
        return ""
    p = Path(s.image_path or "")
    if not p.is_file():
        raise UserError(f"the session's image {p} is missing: put it back, or open the image itself")
    try:
        now = file_sha256(p)
    except OSError as e:
        raise UserError(f"cannot read the session's image {p}: {e.strerror or e}") from None
    if now != s.image_sha256:
        return (f"the image {p.name} changed since the session was saved (its sha256 differs): the maps shown "
                "are of the image as it is now, not the saved one")
    return ""


def model_problem(s: SavedSession) -> None:
    """Raise one line when the session's model is a folder or file that is no longer there (a built-in
    name or hub id is checked by loading it)."""
    src = s.model
    looks_like_path = os.sep in src and not _hub_id(src) or src.startswith((".", "~")) or Path(src).is_absolute()
    if looks_like_path and not Path(src).expanduser().exists():
        raise UserError(f"the session's model {src} is missing (no such folder or file): put it back, or open "
                        "the session's input with another model")


def _hub_id(src: str) -> bool:
    """"org/name": one slash, no leading dot or slash (a hub id, not a relative folder)."""
    parts = src.split("/")
    return len(parts) == 2 and all(parts) and not src.startswith((".", "/", "~"))


# ------------------------------------------------------------------------------------------- restoring
def restore(state: Any, s: SavedSession) -> None:
    """Put session s into `state` (its model already loaded): the input, sliders, view options and
    selection, set directly (no run starts from here: the caller asks for the one run) and announced
    through the state's signals so every control follows."""
    state.input_kind = s.input_kind
    if s.input_kind == "text":
        if s.text != state.text:
            state.text = s.text
            state.text_changed.emit(s.text)
        if s.target != state.target:
            state.target = s.target
            state.target_changed.emit(s.target)
    else:
        state.image = s.image_path
    state.dk_scale, state.dk_layer_only = float(s.dk_scale), bool(s.dk_layer_only)
    state.max_tokens, state.image_size = s.max_tokens, s.image_size
    restore_view(state, {**s.view, "layer": s.layer, "head": s.head, "query": s.query,
                         "query_chosen": s.query_chosen})


def restore_view(state: Any, view: dict) -> None:
    """Put a saved view (options by name, and layer, head, query, query_chosen when known) into state,
    directly, then announce it (options_changed, selection_changed). A value this version does not know
    is skipped: the state keeps its own."""
    from attn_explorer.session.inputs import VIEW_OPTIONS
    from attn_explorer.session.stacks import STACKS as STATE_STACKS

    for key, value in view.items():
        now = getattr(state, key, None)
        if key not in VIEW_OPTIONS or not _same_kind(now, value) or not _allowed(key, value, STATE_STACKS):
            continue
        setattr(state, key, float(value) if isinstance(now, float) else value)
    L, H = state.stack_shape()
    for key, top in (("layer", L), ("head", H)):
        v = view.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v:
            setattr(state, key, min(v, max(top - 1, 0)))
    q = view.get("query")
    if isinstance(q, int) and not isinstance(q, bool) and q >= 0:
        state.query, state._query_chosen = q, bool(view.get("query_chosen", True))
    state.options_changed.emit()
    state.selection_changed.emit(state.layer, state.head)


def _same_kind(now: Any, value: Any) -> bool:
    if isinstance(now, bool) or isinstance(value, bool):
        return isinstance(now, bool) and isinstance(value, bool)
    if isinstance(now, (int, float)):
        return isinstance(value, (int, float))
    return isinstance(now, str) and isinstance(value, str)


def _allowed(key: str, value: Any, stacks: tuple) -> bool:
    if key == "stack":
        return value in stacks
    if key == "colour_scale":
        try:
            from attn_explorer.session.long_view import COLOUR_SCALES
        except ImportError:  # pragma: no cover - a build without the long-input views
            return False
        return value in COLOUR_SCALES
    if key == "alpha":
        return 0 <= value <= 1
    return True


# ------------------------------------------------------------------------------------------- opening
def open_session(state: Any, s: SavedSession) -> bool:
    """Come back to session s in `state` (session.state.SessionState): load its model (unless it is the one
    loaded), then restore its input, sliders, options and selection, and run it once. A missing image or
    model folder is one UserError line, raised before anything changes; a changed image opens as it is
    now, with a line saying so. Returns True when a model load started (the state restores s once that
    model has loaded)."""
    note = image_problem(s)
    model_problem(s)
    state._session_note = note
    info = state.info
    if (info is not None and state.has_model and not state.result_only and not state.runner.loading
            and model_source(info.name) == s.model and info.dtype == s.dtype):
        restore(state, s)
        state.request_run()
        return False
    state._session, state._device_before = s, state.device
    state.device, state.dtype = s.device, s.dtype
    state.load_model(s.model, want_image=s.input_kind == "image")
    return True


def open_result(state: Any, run: Any) -> None:
    """Show a saved run (session.reopen.SavedRun) in `state` without its model: its maps on every page that
    only draws them; a page or slider that needs the model says so. The model loaded (if any) is let go:
    what is on screen is the file's, and a knob must not run another model on another input. Choosing a
    model leaves this mode. The view the run was saved from (layer, head, query, options) is restored."""
    from attn_explorer.session.reopen import tokens_text

    state.sweep.cancel()
    state.host.release()  # no answer of a job started on the old model arrives over the saved run
    state._shown_from, state._session = None, None
    state.result, state._opened, state.result_only = None, run.result, run.label
    state.info = info = run.info
    state.timings, state.fit_tokens, state.cut_reason = [], None, ""
    state.max_tokens, state.image_size, state.dk_scale = None, None, float(run.result.dk_scale)
    state.input_kind = "image" if run.result.grid is not None else "text"
    if run.result.image is not None:  # the pixels the model saw: choosing a model runs it on them
        from PIL import Image

        state.image = Image.fromarray(run.result.image)
    text = str(run.view.get("text") or tokens_text(run.result.tokens, run.result.special))
    if state.input_kind == "text" and text and text != state.text:
        state.text = text
        state.text_changed.emit(text)
    state.layer = info.num_layers - 1 if info.modality == "image" else min(state.layer, info.num_layers - 1)
    state.head = min(state.head, info.num_heads - 1)
    state._query_chosen = False
    state.model_loaded.emit(info)
    restore_view(state, run.view)
    state.request_run()


def saved_run_task(state: Any):
    """The job that pools the saved run's grid mosaic (again: hide specials, another stack); None: none shown."""
    r = state.result if state.result is not None else state._opened
    if r is None:
        return None
    return state.host.pool_task(r, state.hide_special, state.shown_stack,
                                lambda redrawn: _saved_run_pooled(state, redrawn), state.error_raised.emit)


def _saved_run_pooled(state: Any, redrawn: Any) -> None:
    import time

    from attn_explorer.session.inputs import default_query

    if not state.result_only:
        return  # a model was loaded meanwhile
    if not state._query_chosen:
        state.query = default_query(redrawn)
    state.query = min(state.query, len(state.maps(redrawn).rows) - 1)
    state.result, state.result_asked_at = redrawn, state._asked_at
    state.ready_at = time.perf_counter()
    state.attention_ready.emit(redrawn)
    state.saved_run_shown.emit(state.result_only)
