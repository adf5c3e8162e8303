"""File → Export: PNG or SVG of the page on screen, .npz of the attention arrays.

Every file is written to a temporary name in the same folder and moved into place with os.replace,
so a crash never leaves half a file. The .npz holds no pickles: attentions (L, H, N, N) float32,
tokens as a NumPy unicode array, special, model, dk_scale and, for images, grid.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
from PySide6.QtCore import QPoint, QRect, QSize
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QWidget

from attn_explorer.errors import UserError

FORMATS = {".png": "PNG image (*.png)", ".svg": "SVG drawing (*.svg)", ".npz": "NumPy arrays (*.npz)"}


def _temp_beside(path: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=str(path.parent))
    os.close(fd)
    return Path(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic(path: Path, write) -> Path:
    path = Path(path)
    if not path.parent.is_dir():
        raise UserError(f"cannot export: folder {path.parent} does not exist")
    tmp = _temp_beside(path)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def export_png(widget: QWidget, path) -> Path:
    def write(tmp: Path) -> None:
        if not widget.grab().save(str(tmp), "PNG"):
            raise UserError(f"cannot write PNG {path}")
    return _atomic(Path(path), write)


def export_svg(widget: QWidget, path, title: str = "attn-explorer view") -> Path:
    from PySide6.QtSvg import QSvgGenerator

    def write(tmp: Path) -> None:
        gen = QSvgGenerator()
        gen.setFileName(str(tmp))
        size = widget.size()
        gen.setSize(QSize(size.width(), size.height()))
        gen.setViewBox(QRect(0, 0, size.width(), size.height()))
        gen.setTitle(title)
        painter = QPainter(gen)
        try:
            widget.render(painter, QPoint(0, 0))
        finally:
            painter.end()
    return _atomic(Path(path), write)


def export_npz(result, path) -> Path:
    arrays = {
        "attentions": np.ascontiguousarray(result.attentions, dtype=np.float32),
        "tokens": np.array(list(result.tokens), dtype=np.str_),
        "special": np.asarray(result.special, dtype=bool),
        "model": np.array(str(result.model), dtype=np.str_),
        "dk_scale": np.array(float(result.dk_scale), dtype=np.float64),
    }
    if result.grid is not None:
        arrays["grid"] = np.array(result.grid, dtype=np.int64)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
    return _atomic(Path(path), write)


def export_view(kind: str, path, widget: QWidget | None, result) -> Path:
    """Dispatch on the extension: .png, .svg (the widget), .npz (the result)."""
    ext = (kind or Path(path).suffix).lower()
    if ext == ".npz":
        if result is None:
            raise UserError("nothing to export yet: no attention has been computed")
        return export_npz(result, path)
    if widget is None:
        raise UserError("no view to export")
    if ext == ".png":
        return export_png(widget, path)
    if ext == ".svg":
        return export_svg(widget, path)
    raise UserError(f"unknown export format {ext!r}: use .png, .svg or .npz")
