"""What the user asks of the window's File menu: files opened or dropped, export.

`FileActions(window, state)` is held by the window (`window.file_actions`); it only turns menu entries,
keys and dropped files into calls on the session state (or the banner, when a file is bad). The menus
themselves are built in `menus.py`.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QInputDialog

from attn_explorer.errors import UserError
from attn_explorer.files import save_npz
from attn_explorer.gui.window.export import FORMATS, export_view
from attn_explorer.gui.window.export import HTML_FILTER, export_html as start_html_export
from attn_explorer.gui.window.sessions import saved_view
from attn_explorer.session.inputs import read_text_for

TEXT_FILTER = "Text (*.txt *.md *.csv *.json *.py);;All files (*)"
TEXT_SUFFIXES = {".txt", ".md", ".csv", ".json", ".py", ".rst", ".tex"}
MAX_TEXT_BYTES = 1_000_000  # the models read at most a few thousand characters; more only slows the text box
IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.bmp *.gif *.webp *.tif *.tiff);;All files (*)"


class FileActions:
    """Files in and out of `window` (a MainWindow: settings, pages, current_page_name, show_error, statusBar)."""

    def __init__(self, window, state) -> None:
        self.window, self.state = window, state

    # ------------------------------------------------------------------------------- files
    def open_image(self, path: str) -> None:
        self.window.settings.setValue("paths/last_folder", str(Path(path).parent))
        self.state.set_image(path)

    def open_text_file(self, path: str) -> bool:
        """Put a UTF-8 text file into the text box (which runs it). Bad files go to the banner, in the words
        of the command line's --text-file (the same reader: a pipe is refused, never waited on)."""
        p = Path(path)
        try:  # a file longer than the model reads is cut on the way in, with a note (session.inputs.read_text_for)
            text, note = read_text_for(p, self.state.info, MAX_TEXT_BYTES)
        except UserError as e:
            self.window.show_error(str(e))
            return False
        self.window.settings.setValue("paths/last_folder", str(p.parent))
        self.state.set_text(text, note)  # the text box follows the session's text_changed
        return True

    def open_text_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open text file", self.last_folder(), TEXT_FILTER)
        if path:
            self.open_text_file(path)

    def open_model_folder(self, path: str) -> None:
        self.window.settings.setValue("paths/last_folder", str(Path(path).parent))
        self.state.load_model(path, want_image=None)

    def last_folder(self) -> str:
        return str(self.window.settings.value("paths/last_folder", str(Path.home())))

    def open_image_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open image", self.last_folder(), IMAGE_FILTER)
        if path:
            self.open_image(path)

    def open_model_folder_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self.window, "Open model folder", self.last_folder())
        if path:
            self.open_model_folder(path)

    def hf_id_dialog(self) -> None:
        text, ok = QInputDialog.getText(self.window, "Hugging Face id", "Model id (for example bert-base-uncased):")
        if ok and text.strip():
            self.state.load_model(text.strip(), want_image=None)

    def export(self, path: str) -> Path:
        """Export the current page (.png/.svg) or the attention arrays (.npz); errors go to the banner."""
        try:
            if Path(path).suffix.lower() == ".npz" and self.state.result is not None:
                # the arrays, and the view they were saved from, so Open saved run comes back to it
                out = save_npz(self.state.result, path, view=saved_view(self.state, self.window.current_page_name))
            else:
                out = export_view(Path(path).suffix, path, self.window.pages.get(self.window.current_page_name),
                                  self.state.result)
        except Exception as exc:  # noqa: BLE001 - shown, then re-raised for callers that care
            from attn_explorer.session.workers import error_message

            self.window.show_error(error_message(exc))
            raise
        self.window.settings.setValue("paths/last_folder", str(Path(path).parent))
        self.window.statusBar().showMessage(f"saved {out}", 5000)
        return out

    def export_dialog(self) -> None:
        filters = ";;".join(FORMATS.values())
        default = str(Path(self.last_folder()) / f"attention-{self.window.current_page_name or 'view'}.png")
        path, chosen = QFileDialog.getSaveFileName(self.window, "Export", default, filters)
        if not path:
            return
        if Path(path).suffix.lower() not in FORMATS:
            ext = next((e for e, f in FORMATS.items() if f == chosen), ".png")
            path += ext
        try:
            self.export(path)
        except Exception:  # noqa: BLE001 - already shown in the banner
            pass

    def export_html(self, path: str) -> bool:
        """Write the self-contained page of the result, view and selection on screen (in a worker)."""
        return start_html_export(self.window, path)

    def export_html_dialog(self) -> None:
        default = str(Path(self.last_folder()) / f"attention-{self.window.current_page_name or 'view'}.html")
        path, _ = QFileDialog.getSaveFileName(self.window, "Export page as HTML", default, HTML_FILTER)
        if path:
            self.export_html(path if Path(path).suffix.lower() in (".html", ".htm") else path + ".html")

    # ------------------------------------------------------------------------------- drag and drop
    @staticmethod
    def accepts(ev) -> bool:
        """A drag the window takes: a local file or folder."""
        urls = ev.mimeData().urls() if ev.mimeData().hasUrls() else []
        return bool(urls) and urls[0].isLocalFile()

    def open_dropped(self, path: str) -> None:
        """A file or folder dropped onto the window: a session, a saved run, a model folder, text or an image."""
        if Path(path).suffix.lower() in (".axsession", ".npz"):
            sessions = self.window.session_actions
            (sessions.open_session if path.lower().endswith(".axsession") else sessions.open_saved_run)(path)
        elif Path(path).is_dir():
            self.open_model_folder(path)
        elif Path(path).suffix.lower() in TEXT_SUFFIXES:
            self.open_text_file(path)
        else:
            self.open_image(path)
