"""Find files under resources/, from the source tree and from a frozen (PyInstaller) build."""
from __future__ import annotations

import sys
from pathlib import Path


def resource_path(*parts: str) -> Path:
    """Path to resources/<parts...>; works when frozen (sys._MEIPASS) and from a checkout."""
    base = getattr(sys, "_MEIPASS", None)
    root = Path(base) if base else Path(__file__).resolve().parent.parent
    return root.joinpath("resources", *parts)
