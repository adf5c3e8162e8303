"""The decomposing analyses on the 2026 decoders: where the decomposition holds (SmolLM3's NoPE layers, OLMo 2's
norms after each branch) the pieces add up to the logit; where it does not yet (Granite's residual multiplier and
logit divisor; OLMo's full-width q/k norm in the why-matrix) the analysis refuses in one line that names the
family and the reason, never a wrong answer."""
from __future__ import annotations

import pytest

from attn_explorer.analysis import lens, why
from attn_explorer.errors import UserError
from tests.hub.test_parity_2026_decoders import make_folder
from tests.hub.test_parity_rotary_families import loaded

TEXT = "the cat sat on the mat and the dog"


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    return loaded(tmp_path_factory, make_folder)


@pytest.mark.parametrize("name", ["smollm3", "olmo2", "olmo3"])
def test_the_pieces_add_up_to_the_logit(load, name):
    m = load(name)
    a = lens.logit_attribution(m, TEXT)
    assert a.total == pytest.approx(a.logit, abs=1e-3 * max(1.0, abs(a.logit)))
    table = lens.logit_lens(m, TEXT)
    assert len(table.tokens) == len(m.prepare(TEXT).tokens)


@pytest.mark.parametrize("name", ["granite", "granite-bias"])
def test_granite_is_refused_in_one_line(load, name):
    m = load(name)
    for call in (lambda: lens.logit_attribution(m, TEXT), lambda: lens.logit_lens(m, TEXT),
                 lambda: why.why_matrix(m, TEXT, None, 1, 0, 3, 1)):
        with pytest.raises(UserError, match="Granite") as e:
            call()
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["olmo2", "olmo3"])
def test_the_why_matrix_refuses_a_full_width_qk_norm(load, name):
    m = load(name)
    with pytest.raises(UserError, match="q and k") as e:
        why.why_matrix(m, TEXT, None, 1, 0, 3, 1)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["smollm3", "olmo2", "olmo3"])
def test_the_contribution_graph_runs_or_refuses_in_one_line(load, name):
    from attn_explorer.analysis.flow import contribution_graph

    try:
        g = contribution_graph(load(name), TEXT)
    except UserError as e:
        assert "\n" not in str(e)
    else:
        assert g is not None


def test_the_why_matrix_on_a_nope_layer_adds_up(load):
    """SmolLM3's layer 3 has no RoPE: the split must not rotate q and k there either."""
    m = load("smollm3")
    assert m.module.cfg.nope_layers[3]
    for layer in (2, 3):
        w = why.why_matrix(m, TEXT, None, layer, 1, 6, 2)
        assert abs(w.total - w.logit) < 1e-4, (layer, w.total, w.logit)
