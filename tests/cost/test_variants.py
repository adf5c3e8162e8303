"""The one registry of attention variants: every reader takes names, kernels and predictions from it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from attn_explorer.core import efficient
from attn_explorer.cost import variants
from attn_explorer.cost.config import SweepConfig


def test_every_variant_has_a_kernel_in_core_and_the_fields_the_readers_need():
    for name, v in variants.VARIANTS.items():
        assert v.name == name and v.kernel is getattr(efficient, name)
        assert v.colour.startswith("#") and v.label and v.blurb
        assert v.growth in (1.0, 2.0)
    assert {n for n, v in variants.VARIANTS.items() if v.exact} == {"naive", "chunked", "sdpa"}


def test_the_cli_and_the_page_list_the_registrys_variants():
    from attn_explorer.cli import cost as cli_cost
    from attn_explorer.session import cost_sweep

    assert tuple(cli_cost.IMPLS) == variants.NAMES
    assert tuple(cost_sweep.VARIANTS) == variants.NAMES
    assert cost_sweep.VARIANTS["window"]["colour"] == variants.VARIANTS["window"].colour


def test_a_variant_takes_its_options_from_the_config():
    cfg = SweepConfig(ns=[64], window=32, q_block=16, k_block=64)
    assert variants.get("window").kwargs(cfg) == {"window": 32}
    assert variants.get("chunked").kwargs(cfg) == {"q_block": 16, "k_block": 64}
    assert variants.get("naive").kwargs(cfg) == {}
    with pytest.raises(ValueError, match="unknown variant 'flash': choose from naive, chunked"):
        variants.get("flash")


def test_the_guard_counts_the_inputs_and_kept_outputs_on_top_of_the_call():
    cfg = SweepConfig(ns=[64], heads=2, d_k=8)
    call, need = variants.point_bytes("naive", 64, cfg)
    assert call == variants.get("naive").call_bytes(64, cfg)
    assert need - call == 5 * 2 * 64 * 8 * 4  # q, k, v, the reference and the output
    assert variants.fits("naive", 64, cfg, need) and not variants.fits("naive", 64, cfg, need - 1)


def test_the_registry_loads_no_torch():
    code = "import sys, attn_explorer.cost.variants, attn_explorer.cost.config, attn_explorer.cost.fit; " \
           "sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
