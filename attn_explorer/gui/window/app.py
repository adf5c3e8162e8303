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
    """Create the state and window for parsed CLI args, and start loading. Returns (window, state).
    With --session or --open the window comes back to that session or saved run instead."""
    from attn_explorer.gui.window.main_window import MainWindow
    from attn_explorer.session.state import SessionState

    reopened = _reopened(args)  # a bad file is refused here, before any window
    settings = settings if settings is not None else make_settings()
    state = SessionState(loader=loader, device=getattr(args, "device", None) or "auto",
                         dtype=getattr(args, "dtype", None) or "float32")
    window = MainWindow(state, settings)
    if reopened is not None:
        _reopen(window, reopened, getattr(args, "view", None))
        return window, state
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
        from attn_explorer.gui.window.pages import LESSON_NAMES

        if lesson not in LESSON_NAMES:
            from attn_explorer.errors import UserError

            raise UserError(f"unknown lesson {lesson!r}: choose from {', '.join(LESSON_NAMES)}")
        window.show_page(lesson, pin=True)
    elif image and not view:
        window.show_page("overlay")
    state.load_model(src, want_image=bool(image))
    return window, state


def _reopened(args):
    """The session (saved.SavedSession) or saved run (reopen.SavedRun) that --session / --open name, read
    and checked; None without them. Each problem is one UserError line."""
    from attn_explorer.errors import UserError

    session, run = getattr(args, "session", None), getattr(args, "open", None)
    if not session and not run:
        return None
    others = [f"--{k}" for k in ("model", "text", "image", "lesson") if getattr(args, k, None)]
    if session and run:
        others.append("--open")
    if others:
        raise UserError(f"{'--session' if session else '--open'} brings back a whole view: it goes without "
                        f"{', '.join(others)}")
    if run:
        from attn_explorer.session.reopen import read_run

        return read_run(run)
    from attn_explorer.session.saved import image_problem, model_problem, read_session

    s = read_session(session)
    s.problem = image_problem(s)  # a missing image raises; a changed one is this line
    model_problem(s)
    return s


def _reopen(window, reopened, view: str | None) -> None:
    """Bring the window back to a session or saved run; --view, when given, chooses the page."""
    from attn_explorer.errors import UserError
    from attn_explorer.session.reopen import SavedRun

    if view and view not in window.pages:
        raise UserError(f"unknown view {view!r}: choose from {', '.join(window.pages)}")
    if isinstance(reopened, SavedRun):
        if view:
            reopened.view["page"] = view
        window.open_saved_run(reopened)
        return
    if view:
        reopened.page = view
    window.cli_problem = reopened.problem  # the screenshot's exit status reports it
    loads = window.state.open_session(window.session_actions.known_colormap(reopened))
    if reopened.page in window.pages and loads:
        window.session_actions.session_page = reopened.page  # shown when the session's model has loaded
    elif reopened.page in window.pages:
        window.show_page(reopened.page)


def open_window(source, view: str | None = None, settings: QSettings | None = None, loader=None):
    """`ax.open(result_or_path)`: a window showing a saved run (.npz path) or a RunResult, without its
    model, on the page it was saved from when known (or `view`). When a QApplication is already running
    (Jupyter's `%gui qt`, a test, another Qt program) the window is shown and returned at once; otherwise
    this runs the application until the window is closed and returns None."""
    import os

    from attn_explorer.errors import UserError
    from attn_explorer.gui.window.main_window import MainWindow
    from attn_explorer.session.reopen import read_run, saved_run_of
    from attn_explorer.session.state import SessionState

    run = read_run(source) if isinstance(source, (str, os.PathLike)) else saved_run_of(source)
    running = QApplication.instance() is not None
    app = get_qapp()
    state = SessionState(loader=loader)
    window = MainWindow(state, settings if settings is not None else make_settings())
    if view is not None:
        if view not in window.pages:
            window.close()
            raise UserError(f"unknown view {view!r}: choose from {', '.join(window.pages)}")
        run.view["page"] = view
    window.open_saved_run(run)
    window.show()
    if running:
        _OPEN_WINDOWS.add(window)  # kept alive for the caller who drops the reference
        window.destroyed.connect(lambda *_: _OPEN_WINDOWS.discard(window))
        return window
    app.exec()
    from attn_explorer.session.workers import await_workers

    await_workers(30000)
    return None


_OPEN_WINDOWS: set = set()


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


SIDE_JOBS_WAIT_S = 120  # a screenshot waits this long at most for the page's own jobs after the run


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
    # let layouts, lazy pages and the paint settle, and the shown page's own jobs (an analysis, the lens)
    # finish, so the picture is the page's answer and not its "Reading…" line (at most SIDE_JOBS_WAIT_S)
    settle = time.monotonic() + 0.4
    side = time.monotonic() + SIDE_JOBS_WAIT_S
    while time.monotonic() < settle or (state.runner.busy_lanes() and time.monotonic() < side):
        app.processEvents()
        time.sleep(0.01)
        if state.runner.busy_lanes():
            settle = time.monotonic() + 0.3  # the last answer's layout (an axis that widens for its labels) too
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
            problem = getattr(window, "cli_problem", "")
            if code == 0 and problem:  # drawn, and labelled in the picture; the exit status says it too
                print(f"error: {problem} (screenshot saved to {shot})", file=sys.stderr)
                return 2
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
