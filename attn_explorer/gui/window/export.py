"""File → Export: PNG or SVG of the page on screen, .npz of the attention arrays; and Export page as HTML…,
the self-contained page (api/html.py through session.html_export, built in a worker).

Every file is written to a temporary name in the same folder and moved into place with os.replace,
so a crash never leaves half a file. The .npz holds no pickles: attentions (L, H, N, N) float32,
tokens as a NumPy unicode array, special, model, dk_scale and, for images, grid.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint, QRect, QSize
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QWidget

from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write, save_npz

FORMATS = {".png": "PNG image (*.png)", ".svg": "SVG drawing (*.svg)", ".npz": "NumPy arrays (*.npz)"}


def export_png(widget: QWidget, path) -> Path:
    def write(tmp: Path) -> None:
        if not widget.grab().save(str(tmp), "PNG"):
            raise UserError(f"cannot write PNG {path}")
    return atomic_write(Path(path), write)


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
    return atomic_write(Path(path), write)


def export_view(kind: str, path, widget: QWidget | None, result) -> Path:
    """Dispatch on the extension: .png, .svg (the widget), .npz (the result)."""
    ext = (kind or Path(path).suffix).lower()
    if ext == ".npz":
        if result is None:
            raise UserError("nothing to export yet: no attention has been computed")
        return save_npz(result, path)
    if widget is None:
        raise UserError("no view to export")
    if ext == ".png":
        return export_png(widget, path)
    if ext == ".svg":
        return export_svg(widget, path)
    raise UserError(f"unknown export format {ext!r}: use .png, .svg or .npz")


# ---- File → Export page as HTML…: the page of what is on screen, built in a worker -------------------------

HTML_FILTER = "Web page (*.html)"


def export_html(window, path) -> bool:
    """Start writing the page of the window's result, view and selection to path (lane "html-export");
    the status bar says when it is written, the banner when it cannot be. False when nothing started."""
    from attn_explorer.session.html_export import LANE, html_page_job, page_options

    st = window.state
    try:
        options = page_options(st, window.current_page_name)
    except UserError as e:
        window.show_error(str(e))
        return False
    path = str(Path(path))
    window.statusBar().showMessage(f"writing {Path(path).name}…")
    return st.submit(html_page_job, st.result, path, options, key=LANE, uses_model=False,
                     on_result=lambda out: _html_written(window, out),
                     on_progress=lambda _fraction, message: window.statusBar().showMessage(f"writing {message}"),
                     on_error=lambda message: window.show_error(f"export page: {message}"))


def _html_written(window, out: Path) -> None:
    window.settings.setValue("paths/last_folder", str(Path(out).parent))
    window.statusBar().showMessage(f"saved {out}", 5000)
