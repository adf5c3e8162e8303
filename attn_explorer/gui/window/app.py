"""Start the window: the app factory, the settings factory, and `run_gui` for the CLI.

Nothing here imports torch: the window shows first, and the model loads in a worker.
`--screenshot OUT.png` waits for the first attention map (or an error), grabs the window and exits.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QSettings, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

APP_NAME = ORG_NAME = "attn-explorer"
SCREENSHOT_SIZE = (1480, 920)
SCREENSHOT_TIMEOUT_S = 300


def get_qapp(argv: list[str] | None = None) -> QApplication:
    """The one QApplication: names, icon and plot style set once."""
    app = QApplication.instance()
    if app is None:
        app = QApplication(argv if argv is not None else [sys.argv[0]])
    QCoreApplication.setApplicationName(APP_NAME)
    QCoreApplication.setOrganizationName(ORG_NAME)
    from attn_explorer.resources import resource_path

    icon = resource_path("icon.png")
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    from attn_explorer.gui.widgets.heatmap import configure_pyqtgraph

    configure_pyqtgraph()
    return app


def make_settings(path: str | Path | None = None) -> QSettings:
    """The one place QSettings is created; everything else receives it. A path gives an .ini file."""
    if path is not None:
        return QSettings(str(path), QSettings.IniFormat)
    return QSettings(QSettings.IniFormat, QSettings.UserScope, ORG_NAME, APP_NAME)


def build_window(args, settings: QSettings | None = None, loader=None):
    """Create the state and window for parsed CLI args, and start loading. Returns (window, state)."""
    from attn_explorer.gui.window.main_window import MainWindow
    from attn_explorer.session.state import SessionState

    settings = settings if settings is not None else make_settings()
    state = SessionState(loader=loader, device=getattr(args, "device", None) or "auto",
                         dtype=getattr(args, "dtype", None) or "float32")
    window = MainWindow(state, settings)
    text = getattr(args, "text", None)
    image = getattr(args, "image", None)
    if text is not None:
        state.set_text(text)  # before any model: nothing runs yet; the text box follows text_changed
    model = getattr(args, "model", None)
    if image:
        state.image = str(image)
        state.input_kind = "image"
        src = model or None  # None: the default image model
    elif model:
        src = model
    else:  # text input: the last text model (an image model would have no picture to look at)
        src = str(settings.value("model/last_text", "minilm"))
    view = getattr(args, "view", None)
    if view:
        if view not in window.pages:
            from attn_explorer.errors import UserError

            raise UserError(f"unknown view {view!r}: choose from {', '.join(window.pages)}")
        window.show_page(view, pin=True)
    lesson = getattr(args, "lesson", None)
    if lesson:
        from attn_explorer.session.lessons import LESSONS

        if lesson not in LESSONS:
            from attn_explorer.errors import UserError

            raise UserError(f"unknown lesson {lesson!r}: choose from {', '.join(LESSONS)}")
        window.show_page("lessons", pin=True)
        window.pages["lessons"].show_lesson(lesson)
    elif image and not view:
        window.show_page("overlay")
    state.load_model(src, want_image=bool(image))
    return window, state


def window_size(text: str | None) -> tuple[int, int] | None:
    """'1024x700' -> (1024, 700); None for no text. Anything else is one clear UserError."""
    if not text:
        return None
    from attn_explorer.errors import UserError

    w, sep, h = text.lower().replace("×", "x").partition("x")
    try:
        size = (int(w), int(h)) if sep else None
    except ValueError:
        size = None
    if size is None or not (320 <= size[0] <= 10000 and 240 <= size[1] <= 10000):
        raise UserError(f"--size {text!r}: give WIDTHxHEIGHT in pixels, for example 1024x700")
    return size


def _save_screenshot(app, window, state, out: Path) -> int:
    """Wait for the first result (or an error), then grab the window into `out`."""
    outcome: dict[str, str] = {}
    state.attention_ready.connect(lambda r: outcome.setdefault("ok", "ok"))
    state.error_raised.connect(lambda m: outcome.setdefault("error", m))
    deadline = time.monotonic() + SCREENSHOT_TIMEOUT_S
    while "ok" not in outcome and time.monotonic() < deadline:
        app.processEvents()
        if "error" in outcome and not state.busy:
            break
        if state.has_model and not state.busy and not state.has_input:
            outcome["empty"] = "empty"  # no run will come: the empty state is the picture
            break
        time.sleep(0.01)
    # let layouts, lazy pages and the paint settle
    settle = time.monotonic() + 0.4
    while time.monotonic() < settle:
        app.processEvents()
        time.sleep(0.01)
    out.parent.mkdir(parents=True, exist_ok=True)
    from attn_explorer.gui.window.export import export_png

    export_png(window, out)
    if "ok" in outcome:
        print(f"saved {out}")
        return 0
    if "empty" in outcome:
        print(f"saved {out} (the input is empty: nothing to run)")
        return 0
    print(f"error: {outcome.get('error', 'timed out waiting for the first attention map')} "
          f"(screenshot saved to {out})", file=sys.stderr)
    return 2


def run_gui(args) -> int:
    size = window_size(getattr(args, "size", None))
    app = get_qapp()
    shot = getattr(args, "screenshot", None)
    if shot:
        # A screenshot shows exactly what the command line asks for: the user's saved settings
        # are neither read nor changed.
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            window, state = build_window(args, settings=make_settings(Path(d) / "settings.ini"))
            window.resize(*(size or SCREENSHOT_SIZE))
            window.show()
            code = _save_screenshot(app, window, state, Path(shot))
            window.close()
            return code
    window, state = build_window(args)
    if size:
        window.resize(*size)
    window.show()
    QTimer.singleShot(0, window.raise_)
    code = int(app.exec())
    from attn_explorer.session.workers import await_workers

    await_workers(30000)  # a job the closed window stopped ends before Python does (its result is dropped)
    return code
