"""Checks of user-given numbers, shared by the API, the CLI and the GUI; each failure is one UserError line."""
from __future__ import annotations

import math

from attn_explorer.errors import UserError


def positive_float(value, name: str) -> float:
    """A positive finite number, such as a d_k scale."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a positive number, got {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise UserError(f"{name} must be a positive finite number, got {value!r}")
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
