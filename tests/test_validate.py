"""validate.py: the shared checks of user-given numbers and text, each failure one UserError line."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer import validate
from attn_explorer.errors import UserError


@pytest.mark.parametrize("value", [1, "0.05", 20.0, "1e-6", validate.MAX_DK_SCALE])
def test_dk_scale_accepts_every_useful_scale(value):
    assert validate.dk_scale_value(value, "--dk-scale") == float(value)


@pytest.mark.parametrize("value", [0, -1, "nan", "inf", "abc", None, 3e38, 1e300, validate.MAX_DK_SCALE * 1.01])
def test_dk_scale_refuses_non_positive_non_finite_and_overflowing(value):
    with pytest.raises(UserError) as e:
        validate.dk_scale_value(value, "--dk-scale")
    assert str(e.value).startswith("--dk-scale must be") and "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["a", " x ", "\u00e9", "\u4e2d", "\U0001f600", "\x00a", "\u200bword"])
def test_visible_text(text):
    assert validate.has_visible_text(text)


@pytest.mark.parametrize("text", ["", " \t\n\r", "\x00" * 5, "\x01\x1b\x7f", "\u200b\u200c\u200d\u2060\ufeff",
                                  "\u00a0\u2003\u3000", "\u2028\u2029", "\u00ad", "\x85"])
def test_invisible_text(text):
    assert not validate.has_visible_text(text)
    with pytest.raises(UserError, match="^the text is empty"):
        validate.visible_text(text)


def test_visible_text_is_returned_unchanged():
    assert validate.visible_text("\u200bhi\x00") == "\u200bhi\x00"


def test_finite_attention():
    att = np.full((2, 3, 4, 4), 0.25, dtype=np.float32)
    validate.finite_attention(att)  # no error
    for bad in (np.nan, np.inf):
        broken = att.copy()
        broken[1, 2, 3, 0] = bad
        with pytest.raises(UserError) as e:
            validate.finite_attention(broken)
        assert "NaN" in str(e.value) and "\n" not in str(e.value)
