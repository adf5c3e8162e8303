"""Random Unicode through the tokenizer and the model: our input error, or attention whose rows sum to 1."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attn_explorer as ax
from attn_explorer.errors import UserError


@pytest.fixture(scope="module")
def minilm():
    return ax.load_model("minilm", device="cpu")


@pytest.fixture(scope="module")
def textbook():
    return ax.load_model("textbook", device="cpu")


TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _check(model, text, max_tokens=None):
    try:
        r = model.run(text, max_tokens=max_tokens)
    except UserError as e:
        assert str(e) and "\n" not in str(e)
        return
    att = r.attentions
    assert att.shape[-1] == att.shape[-2] == len(r.tokens) > 0
    assert np.isfinite(att).all()
    np.testing.assert_allclose(att.sum(-1), 1.0, atol=1e-4)
    if max_tokens is not None:
        assert len(r.tokens) <= max_tokens


@SETTINGS
@given(text=TEXT)
def test_minilm_any_unicode(minilm, text):
    _check(minilm, text)


@SETTINGS
@given(text=TEXT, k=st.integers(min_value=1, max_value=40))
def test_minilm_any_unicode_cut(minilm, text, k):
    _check(minilm, text, max_tokens=k)


@SETTINGS
@given(text=TEXT)
def test_textbook_any_unicode(textbook, text):
    _check(textbook, text)
