"""save_checkpoint writes through the one atomic writer: normal permissions, no leftovers, one-line errors."""
from __future__ import annotations

import os
import stat

import pytest

import attn_explorer as ax
from attn_explorer.errors import UserError


@pytest.fixture(scope="module")
def vit():
    return ax.load_model("textbook-vit", device="cpu")


def test_saved_file_has_normal_permissions_and_loads_back(vit, tmp_path):
    old = os.umask(0o022)
    try:
        path = ax.save_checkpoint(vit, tmp_path / "v.safetensors", trained=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.safetensors"]
    assert ax.load_model(str(path), device="cpu").info.trained is False


def test_a_folder_in_the_way_is_one_line_and_nothing_is_left(vit, tmp_path):
    (tmp_path / "taken.safetensors").mkdir()
    with pytest.raises(UserError) as e:
        ax.save_checkpoint(vit, tmp_path / "taken.safetensors")
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.safetensors"]
