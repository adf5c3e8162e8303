"""The shared cache of converted folders: built atomically, checked against its manifest and the
safetensors header, stale half-builds removed, an unwritable cache reported in one line."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from attn_explorer.errors import UserError
from attn_explorer.hub import cache

SHAPES = {"a.weight": (3, 4), "b.bias": (4,)}
FILES = ("model.safetensors", "config.json")


def write_folder(out_dir: Path, tensors: dict | None = None, listed: list[str] | None = None) -> Path:
    tensors = tensors if tensors is not None else {k: torch.ones(s) for k, s in SHAPES.items()}
    with cache.building(out_dir) as folder:
        cache.write_safetensors(folder / "model.safetensors", tensors, metadata={"format": "pt"})
        cache.write_json(folder / "config.json", {"model_type": "test"})
        cache.write_manifest(folder, FILES, note="a test", tensors=listed if listed is not None else sorted(tensors))
    return out_dir


def test_a_written_folder_passes_both_checks(tmp_path):
    folder = write_folder(tmp_path / "entry")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert list(manifest) == ["format", "note", "tensors", "files"]  # fields in the order given, files last
    assert manifest["files"]["config.json"]["sha256"] == cache.sha256(folder / "config.json")
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert cache.folder_problem(folder, FILES, SHAPES) is None
    assert cache.folder_problem(folder, FILES) is None  # names from the manifest


def test_a_crash_inside_the_block_leaves_the_old_folder(tmp_path):
    old = write_folder(tmp_path / "entry")
    before = (old / "manifest.json").read_bytes()
    with pytest.raises(KeyboardInterrupt), cache.building(old) as folder:
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]  # no temporary folder left
    assert (old / "manifest.json").read_bytes() == before


def test_a_new_build_replaces_the_old_folder(tmp_path):
    write_folder(tmp_path / "entry")
    folder = write_folder(tmp_path / "entry", {"c.weight": torch.zeros(2, 2)})
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]
    assert cache.folder_problem(folder, FILES) is None
    assert cache.folder_problem(folder, FILES, SHAPES) == "model.safetensors holds other tensors than expected"


@pytest.mark.parametrize("tensors, shapes, problem", [
    ({"a.weight": torch.ones(4, 3), "b.bias": torch.ones(4)}, SHAPES,
     "model.safetensors has a wrong dtype or shape for a.weight"),
    ({"a.weight": torch.ones(3, 4, dtype=torch.float16), "b.bias": torch.ones(4)}, None,
     "model.safetensors has a wrong dtype or byte range for a.weight"),
    ({"a.weight": torch.ones(3, 4)}, None, "model.safetensors holds other tensors than the manifest lists"),
])
def test_the_header_is_checked_against_the_expected_tensors(tmp_path, tensors, shapes, problem):
    folder = write_folder(tmp_path / "entry", tensors, listed=sorted(SHAPES))
    assert cache.folder_problem(folder, FILES, shapes) == problem


def test_damage_is_named(tmp_path):
    folder = write_folder(tmp_path / "entry")
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, newer mtime: only the hash sees it
    weights.write_bytes(bytes(data))
    assert cache.folder_problem(folder, FILES) == "model.safetensors has changed since it was written"
    weights.write_bytes(bytes(data[:-4]))
    assert cache.folder_problem(folder, FILES) == (
        f"model.safetensors has {len(data) - 4} bytes, the manifest says {len(data)}")
    (folder / "config.json").unlink()
    assert cache.folder_problem(folder, ("config.json",)) == "config.json is missing"
    (folder / "manifest.json").write_text("{not json")
    assert cache.folder_problem(folder, FILES) == "manifest.json is unreadable"
    (folder / "manifest.json").unlink()
    assert cache.folder_problem(folder, FILES) == "manifest.json is missing"


def test_only_old_half_builds_of_the_entry_are_removed(tmp_path):
    stale, fresh, other = (tmp_path / ".entry.tmp-1", tmp_path / ".entry.tmp-2", tmp_path / ".other.tmp-1")
    for path in (stale, fresh, other):
        path.mkdir()
    hours_ago = time.time() - 2 * 3600
    for path in (stale, other):
        os.utime(path, (hours_ago, hours_ago))
    cache.remove_stale_builds(tmp_path, "entry")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.tmp-2", ".other.tmp-1"]


class Builds:
    """A converter for ``converted_folder`` that counts its calls."""

    def __init__(self):
        self.sources: list[Path] = []

    def __call__(self, source: Path, out_dir: Path) -> Path:
        self.sources.append(source)
        return write_folder(out_dir)


def problem(folder: Path) -> str | None:
    return cache.folder_problem(folder, FILES, SHAPES)


def test_a_whole_entry_is_reused_and_a_broken_one_rebuilt(tmp_path):
    builds, steps = Builds(), []
    source = tmp_path / "source.bin"
    args = ("entry", problem, lambda: source, builds, lambda f, m: steps.append((f, m)), (0.6, "ready (cached)"))
    folder = cache.converted_folder(tmp_path / "cache", *args)
    assert folder == tmp_path / "cache" / "entry" and builds.sources == [source] and steps == []
    assert cache.converted_folder(tmp_path / "cache", *args) == folder
    assert builds.sources == [source] and steps == [(0.6, "ready (cached)")]
    (folder / "model.safetensors").write_bytes(b"")
    assert cache.converted_folder(tmp_path / "cache", *args) == folder and len(builds.sources) == 2
    assert problem(folder) is None


def test_a_missing_source_is_reported_before_anything_is_written(tmp_path):
    def no_source() -> Path:
        raise UserError("install the source")

    with pytest.raises(UserError, match="install the source"):
        cache.converted_folder(tmp_path / "cache", "entry", problem, no_source, Builds(), None, (1.0, ""))
    assert not (tmp_path / "cache").exists()


def test_an_unwritable_cache_is_one_line_naming_the_variable(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    with pytest.raises(UserError) as info:
        cache.converted_folder(blocker / "cache", "entry", problem, lambda: blocker, Builds(), None, (1.0, ""))
    message = str(info.value)
    assert cache.CACHE_ENV in message and str(blocker / "cache") in message and "\n" not in message


def test_the_cache_folder_defaults_to_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "mine"))
    assert cache.default_cache_dir() == tmp_path / "mine"
    assert cache.converted_folder(None, "entry", problem, lambda: tmp_path, Builds(), None, (1.0, "")) == (
        tmp_path / "mine" / "entry")
