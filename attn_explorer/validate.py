"""Checks of user-given numbers and text, shared by the API, the CLI and the GUI; each failure is one
UserError line. Also the last check before a result is shown or saved: attention must be finite."""
from __future__ import annotations

import math
import unicodedata

from attn_explorer.errors import UserError

# Softmax is already one-hot long before 10000x; larger scales add nothing but overflow (3e38 turned
# every logit into inf and the attention into NaN). The GUI slider stops at 20x.
MAX_DK_SCALE = 1e4
EMPTY_TEXT = "the text is empty; type or paste some words"
# The most text read at once, typed or from a file (UTF-8 bytes). A model keeps only its first few thousand
# words, but the whole text is tokenised to say how much was cut: ~0.7 s and ~150 MB a megabyte here.
# The limit is for input that is not a text to read at all (a log, a disk image); a book fits.
MAX_TEXT_BYTES = 4_000_000
# Unicode categories that draw nothing: controls (NUL, ESC), format characters (zero-width space and
# joiners, BOM, soft hyphen), surrogates, unassigned code points, and separators (spaces, line breaks).
_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Cn", "Zs", "Zl", "Zp"})


def positive_float(value, name: str) -> float:
    """A positive finite number."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a positive number, got {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise UserError(f"{name} must be a positive finite number, got {value!r}")
    return x


def dk_scale_value(value, name: str) -> float:
    """The multiplier of 1/sqrt(d_k): positive, finite and at most MAX_DK_SCALE."""
    x = positive_float(value, name)
    if x > MAX_DK_SCALE:
        raise UserError(f"{name} must be at most {MAX_DK_SCALE:g} (larger scales only overflow the attention "
                        f"logits), got {value!r}")
    return x


def positive_int(value, name: str) -> int:
    """A whole number >= 1, such as a token count."""
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise UserError(f"{name} must be a positive integer, got {str(value)!r}")
    return n


def has_visible_text(text: str) -> bool:
    """Whether text has at least one character that draws something."""
    return any(not ch.isspace() and unicodedata.category(ch) not in _INVISIBLE for ch in text)


def text_size_ok(text: str) -> str:
    """text unchanged, or one UserError line when it is larger than MAX_TEXT_BYTES in UTF-8."""
    if len(text) > MAX_TEXT_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise UserError(f"the text is larger than {MAX_TEXT_BYTES / 1e6:g} MB; give a shorter text "
                        "(a model reads only its first few thousand words)")
    return text


def visible_text(text: str) -> str:
    """text unchanged, or UserError(EMPTY_TEXT) when nothing in it is visible (NUL, zero-width, white space)."""
    if not has_visible_text(text):
        raise UserError(EMPTY_TEXT)
    return text


def finite_attention(att):
    """att (a NumPy array) unchanged, or UserError when it holds NaN or infinity (logits that overflowed,
    e.g. in float16)."""
    import numpy as np

    # NaN and infinity survive a sum (inf - inf is NaN), and the float64 sum needs no temporary as large as
    # the maps (np.isfinite(att).all() makes one, a byte an element). Only a sum that overflowed on finite
    # values (float64 near 1e308; never float32) needs the element-wise check.
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.sum(att, dtype=np.float64)
    if not np.isfinite(total) and not np.isfinite(att).all():
        raise UserError("the attention came out as NaN or infinity (the logits overflowed); "
                        "try a smaller dk scale or float32")
    return att


def existing_head(layer: int, head: int, layers: int, heads: int, owner: str = "the model") -> tuple[int, int]:
    """(layer, head) as ints when the head exists among `layers` × `heads`, or one UserError line naming
    what `owner` ("the run", a model's name) has."""
    layer, head = int(layer), int(head)
    if not (0 <= layer < layers and 0 <= head < heads):
        raise UserError(f"no head L{layer} H{head}: {owner} has layers 0..{layers - 1} and heads 0..{heads - 1}")
    return layer, head
