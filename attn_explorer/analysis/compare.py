"""Two runs side by side: the signed difference b − a of their attention, when their shapes agree."""
from __future__ import annotations

import numpy as np

from attn_explorer.errors import UserError


def shape_text(shape) -> str:
    return "×".join(str(int(s)) for s in shape)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def mismatch(a, b, tokens_a=None, tokens_b=None, names: tuple[str, str] = ("A", "B")) -> str:
    """"" when a and b ((L, H, N, N) attention) can be compared; otherwise why not, in one plain line that
    names them as `names` says (the GUI says "A (the Text box)"). Same shape but other tokens: a note."""
    na, nb = names
    sa, sb = np.shape(a), np.shape(b)
    if sa != sb:
        if len(sa) == len(sb) == 4 and sa[:2] != sb[:2]:
            return (f"cannot compare: {na}'s model has {_plural(sa[0], 'layer')} of {_plural(sa[1], 'head')} and "
                    f"{nb}'s has {_plural(sb[0], 'layer')} of {_plural(sb[1], 'head')}; heads can only be paired "
                    "between models of the same size")
        if len(sa) == len(sb) == 4:
            more = "more" if sb[-1] < sa[-1] else "fewer"
            return (f"cannot compare: {na} has {_plural(sa[-1], 'token')} and {nb} has {sb[-1]}; the maps are "
                    f"subtracted token by token, so {nb} needs {abs(sa[-1] - sb[-1])} {more} (for example, change "
                    "one word)")
        return f"cannot compare: {na} is {shape_text(sa)} and {nb} is {shape_text(sb)}"
    if tokens_a is not None and tokens_b is not None and list(tokens_a) != list(tokens_b):
        i = next(i for i, (x, y) in enumerate(zip(tokens_a, tokens_b)) if x != y)
        return (f"note: the tokens differ from token {i} on ({tokens_a[i]!r} vs {tokens_b[i]!r}); "
                "the difference compares positions, not words")
    return ""


def attention_diff(a, b) -> np.ndarray:
    """b − a, float32, for two attention arrays of the same shape (a UserError says why not otherwise)."""
    why = mismatch(a, b)
    if why:
        raise UserError(why)
    return (np.asarray(b, dtype=np.float32) - np.asarray(a, dtype=np.float32))
