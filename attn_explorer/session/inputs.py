"""The session's input and options: what the next run sees and how its maps are drawn.

`InputState` holds the text or image (and which of the two is the input), the d_k scale, the cut
(max_tokens / image_size), the selected layer, head and query, and the view options. It is the one
source of truth for them: the text box follows `text_changed`, the toolbar follows `selection_changed`
and `options_changed`. It runs nothing itself: each change is announced as `input_changed(what)`, which
the session (`SessionState`, that holds it as `state.inputs`) turns into a run, a re-pooling or a model
switch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Signal

from attn_explorer.api.result import ModelInfo, RunResult
from attn_explorer.session.jobs import DEFAULT_TEXT_MODEL
from attn_explorer.session.long_view import COLOUR_SCALES
from attn_explorer.session.stacks import STACKS, StackMaps, stack_maps

SAMPLE_TEXT = "The animal didn't cross the street because it was too tired."
DK_MIN, DK_MAX = 0.05, 20.0
VIEW_OPTIONS = ("colormap", "log_scale", "hide_special", "alpha", "stack", "colour_scale")
# a text file longer than this many bytes per position the model reads is cut to that before it reaches the
# text box (a token is rarely more than a few bytes; the model then cuts the rest to its positions itself)
FILE_BYTES_PER_POSITION = 32


def read_text_for(path, info: ModelInfo | None, max_bytes: int | None = None) -> tuple[str, str]:
    """A text file of any size, as the text box takes it: (text, note). A file short enough for a model to
    read whole is read whole (the one reader, `files.read_text_file`, and its one-line refusals), note "".
    A longer one is cut to its first bytes, FILE_BYTES_PER_POSITION for each position the open model reads
    (at most max_bytes, validate.MAX_TEXT_BYTES when not given, at a character boundary), and the note says
    so; the model then keeps its first tokens of that, and the run's own note says how many."""
    import os

    from attn_explorer.errors import UserError
    from attn_explorer.files import read_text_file
    from attn_explorer.validate import MAX_TEXT_BYTES

    p = Path(path)
    most = MAX_TEXT_BYTES if max_bytes is None else int(max_bytes)
    positions = info.max_positions if info is not None and info.modality == "text" else None
    keep = min(most, positions * FILE_BYTES_PER_POSITION) if positions else most
    try:
        size = os.stat(p).st_size
    except OSError:
        size = 0  # the reader says what is wrong
    if size <= keep or not p.is_file():
        return read_text_file(p, most), ""
    try:
        with open(p, "rb") as f:
            data = f.read(keep + 4)
    except OSError as e:
        raise UserError(f"cannot read {p}: {e.strerror or e}") from e
    data = data[:keep]
    for cut in range(4):  # a character split at the cut: drop its first bytes
        try:
            text = data[:len(data) - cut].decode("utf-8-sig")
            break
        except UnicodeDecodeError as e:
            if e.start < len(data) - 4:
                raise UserError(f"{p.name} is not UTF-8 text (byte {e.start} is {data[e.start]:#04x})") from None
    else:  # pragma: no cover - four trailing bytes never all start characters
        raise UserError(f"{p.name} is not UTF-8 text")
    from attn_explorer.validate import has_visible_text

    if not has_visible_text(text):  # the same refusal as a short file's, for the part that would be read
        raise UserError(f"{p.name} is empty where it would be read (no visible characters in its first "
                        f"{len(data) / 1e6:.3g} MB of {size / 1e6:.3g} MB)")
    who = f"{info.name} reads at most {positions:,} tokens" if positions else "a model reads only its first tokens"
    note = (f"{p.name} has {size / 1e6:.3g} MB of text; only its first {len(text.encode('utf-8')) / 1e6:.3g} MB "
            f"went into the text box ({who})")
    return text, note


def default_query(r: RunResult) -> int:
    """The query shown before the user picks one: [CLS] for images, "it" or the first word for text."""
    pos = getattr(r, "image_token_positions", None)
    if pos is not None and len(pos):  # a picture and a prompt (issue 26 B): the prompt's last plain token asks
        text = np.ones(r.num_tokens, bool)
        text[pos[:, 0]] = False
        text &= ~np.asarray(r.special, dtype=bool)
        return int(np.flatnonzero(text)[-1]) if text.any() else r.num_tokens - 1
    if r.grid is not None:
        return 0
    for i, t in enumerate(r.tokens):
        if t.strip().lstrip("Ġ▁").lower() == "it":
            return i
    plain = np.flatnonzero(~np.asarray(r.special, dtype=bool))
    return int(plain[0]) if plain.size else 0


class InputState(QObject):
    """Input, knobs, selection and view options. Views connect to its past-tense signals."""

    text_changed = Signal(str)  # the text input, whoever set it (the text box follows it)
    input_cleared = Signal()  # the input became empty: nothing is shown until there is some
    selection_changed = Signal(int, int)  # layer, head
    query_changed = Signal(int)  # token index of the query
    options_changed = Signal()  # colormap, log scale, hide specials, overlay alpha, the stack shown
    target_changed = Signal(str)  # encoder-decoders: the decoder's target text (the target box follows it)
    # what changed, for the session to act on: "text", "image", "knob" (d_k, cut), "layer" (matters to a
    # one-layer d_k) or "pooling" (hide specials, the stack shown); alone, nothing runs
    input_changed = Signal(str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        # what the job side fills in: the loaded model's description and the result on screen
        self.info: ModelInfo | None = None
        self.result: RunResult | None = None
        # input
        self.text: str = SAMPLE_TEXT
        self.target: str = ""  # encoder-decoders: the decoder's text ("": the decoder reads the source)
        self.image: Any = None  # a file path (str) or a PIL image
        self.input_kind: str = "text"  # "text" or "image"
        self.text_note: str = ""  # how the text was cut on its way in (a long file), "" when it was not
        self.last_text_model: str = DEFAULT_TEXT_MODEL
        # knobs that change the run
        self.dk_scale: float = 1.0
        self.dk_layer_only: bool = False
        self.max_tokens: int | None = None  # text: keep the first n tokens
        self.image_size: int | None = None  # image: square side in pixels
        # selection and view options
        self.layer: int = 0
        self.head: int = 0
        self.query: int = 0
        self._query_chosen = False
        self.colormap: str = "viridis"
        self.log_scale: bool = False
        self.hide_special: bool = False
        self.alpha: float = 0.55
        self.stack: str = "encoder"  # encoder-decoders: which maps the explorer pages draw (STACKS)
        self.colour_scale: str = "weight"  # the one-head view and its strip: weight, per row or clip (COLOUR_SCALES)

    # ----------------------------------------------------------------------------- input
    @property
    def has_input(self) -> bool:
        """There is something to run: an image, or text with a visible character."""
        x, _ = self.run_input()
        return x is not None and not (self.input_kind == "text" and not str(x).strip())

    def set_text(self, text: str, note: str = "") -> None:
        """Make `text` the input (the text box, a lesson's button, a file, a restored session). `note` says how
        it was cut on its way in (a long file: `read_text_for`); it stays until the text changes again."""
        text = str(text)
        changed = text != self.text
        if changed or note:
            self.text_note = note
        self.text = text
        self.input_kind = "text"
        if changed:
            self.text_changed.emit(text)
        self.input_changed.emit("text")

    def set_target(self, target: str) -> None:
        """The decoder's text of an encoder-decoder (the target box); runs again when such a model is open."""
        target = str(target)
        if target == self.target:
            return
        self.target = target
        self.target_changed.emit(target)
        if self.info is not None and self.info.encoder_decoder:
            self.input_changed.emit("knob")

    def set_image(self, image: Any) -> None:
        """Show an image (a path or a PIL image); switches to the default image model if needed."""
        self.image = str(image) if isinstance(image, Path) else image
        self.input_kind = "image"
        self._query_chosen = False
        self.query = 0
        self.input_changed.emit("image")

    def set_dk_scale(self, scale: float, layer_only: bool | None = None) -> None:
        scale = float(min(max(scale, DK_MIN), DK_MAX))
        if layer_only is not None:
            self.dk_layer_only = bool(layer_only)
        if scale == self.dk_scale and layer_only is None:
            return
        self.dk_scale = scale
        self.input_changed.emit("knob")

    def set_dk_layer_only(self, only: bool) -> None:
        if bool(only) != self.dk_layer_only:
            self.dk_layer_only = bool(only)
            if self.dk_scale != 1.0:
                self.input_changed.emit("knob")

    def set_max_tokens(self, n: int | None) -> None:
        total = self.result.total_tokens if self.result is not None and self.result.grid is None else 0
        if n is not None and total and n >= total:
            n = None
        if n != self.max_tokens:
            self.max_tokens = n
            self.input_changed.emit("knob")

    def set_image_size(self, side: int | None) -> None:
        if side != self.image_size:
            self.image_size = side
            self.input_changed.emit("knob")

    def run_input(self) -> tuple[Any, dict]:
        """What the next run sees: the input object and Model.run keyword arguments."""
        kw: dict = {"dk_scale": self.dk_scale}
        if self.dk_layer_only and self.dk_scale != 1.0:
            kw["dk_layers"] = [self.layer]
        if self.info is not None and self.info.modality == "image-text":  # issue 26 B: the picture and the prompt
            kw["text"] = self.text
            return self.image, kw
        if self.input_kind == "image":
            if self.image_size is not None:
                kw["image_size"] = int(self.image_size)
            return self.image, kw
        if self.max_tokens is not None:
            kw["max_tokens"] = int(self.max_tokens)
        if self.info is not None and self.info.encoder_decoder and self.target.strip():
            kw["target"] = self.target
        return self.text, kw

    # ----------------------------------------------------------------------------- stack
    @property
    def shown_stack(self) -> str:
        """The stack the pages draw: `stack` for an encoder-decoder, else "encoder" (the only one)."""
        return self.stack if self.info is not None and self.info.encoder_decoder else "encoder"

    def stack_shape(self) -> tuple[int, int]:
        """(layers, heads) of the stack shown: the decoder's for the decoder and cross stacks."""
        i = self.info
        if i is None:
            return 0, 0
        if self.shown_stack != "encoder":
            return i.decoder_layers, i.decoder_heads
        return i.num_layers, i.num_heads

    def layer_kinds(self) -> tuple[str, ...]:
        """Per layer of the stack shown, "local, window N" or "global" (ModelInfo.layer_kinds); () when
        every layer sees every token (and for an encoder-decoder's stacks)."""
        i = self.info
        if i is None or self.shown_stack != "encoder" or len(i.layer_kinds) != i.num_layers:
            return ()
        return tuple(i.layer_kinds)

    def maps(self, r: RunResult | None = None) -> StackMaps | None:
        """The shown stack's maps of r (the result on screen when not given)."""
        r = self.result if r is None else r
        return None if r is None else stack_maps(r, self.shown_stack)

    # ----------------------------------------------------------------------------- selection
    def select(self, layer: int | None = None, head: int | None = None) -> None:
        if self.info is None:
            return
        L, H = self.stack_shape()
        new_layer = self.layer if layer is None else int(layer) % L
        new_head = self.head if head is None else int(head) % H
        if (new_layer, new_head) == (self.layer, self.head):
            return
        layer_moved = new_layer != self.layer
        self.layer, self.head = new_layer, new_head
        self.selection_changed.emit(self.layer, self.head)
        if layer_moved and self.dk_layer_only and self.dk_scale != 1.0:
            self.input_changed.emit("layer")

    def step_layer(self, delta: int) -> None:
        if self.info is not None:
            self.select(layer=max(0, min(self.stack_shape()[0] - 1, self.layer + delta)))

    def step_head(self, delta: int) -> None:
        if self.info is not None:
            self.select(head=max(0, min(self.stack_shape()[1] - 1, self.head + delta)))

    def set_query(self, index: int) -> None:
        m = self.maps()
        n = len(m.rows) if m is not None else 0
        if n == 0:
            return
        index = int(max(0, min(n - 1, index)))
        self._query_chosen = True
        if index != self.query:
            self.query = index
            self.query_changed.emit(index)

    def set_options(self, **kw) -> None:
        """colormap=, log_scale=, hide_special=, alpha=, stack=, colour_scale=; emits options_changed once."""
        changed, was = False, (self.hide_special, self.stack)
        for k, v in kw.items():
            if k not in VIEW_OPTIONS:
                raise AttributeError(k)
            if k == "stack" and v not in STACKS:
                raise ValueError(f"stack must be one of {', '.join(STACKS)}, not {v!r}")
            if k == "colour_scale" and v not in COLOUR_SCALES:
                raise ValueError(f"colour_scale must be one of {', '.join(COLOUR_SCALES)}, not {v!r}")
            if getattr(self, k) != v:
                setattr(self, k, v)
                changed = True
        if self.stack != was[1]:
            self._fit_selection()
        if changed:
            self.options_changed.emit()
        if (self.hide_special, self.stack) != was and self.result is not None:
            self.input_changed.emit("pooling")  # the grid's mosaic is pooled again (without the specials, another stack)

    def _fit_selection(self) -> None:
        """Keep the layer, head and query inside the stack shown (the decoder may have fewer)."""
        L, H = self.stack_shape()
        if L and H and (self.layer >= L or self.head >= H):
            self.layer, self.head = min(self.layer, L - 1), min(self.head, H - 1)
            self.selection_changed.emit(self.layer, self.head)
        m = self.maps()
        if m is not None and self.query >= len(m.rows):
            self.query = len(m.rows) - 1
            self.query_changed.emit(self.query)
