"""Two runs side by side: the signed difference b − a of their attention, when their shapes agree."""
from __future__ import annotations

import numpy as np

from attn_explorer.errors import UserError


def shape_text(shape) -> str:
    return "×".join(str(int(s)) for s in shape)


def mismatch(a, b, tokens_a=None, tokens_b=None) -> str:
    """"" when a and b can be compared; otherwise why not, in one line."""
    sa, sb = np.shape(a), np.shape(b)
    if sa != sb:
        names = ("layers", "heads", "query tokens", "key tokens")[-len(sa):] if len(sa) == len(sb) else ()
        what = next((f"{names[i]}: {x} vs {y}" for i, (x, y) in enumerate(zip(sa, sb)) if x != y and names), "")
        return f"cannot compare: A is {shape_text(sa)} and B is {shape_text(sb)}" + (f" ({what})" if what else "")
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
