"""The window's File and View menus, with their shortcuts (tests/gui/test_window.py presses them).

`build_menus(window)` fills the menu bar from the actions the window holds (`file_actions`,
`session_actions`, `toolbar`) and its pages; `add_action` is one menu entry with its shortcut.
"""
from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence

from attn_explorer.gui.window.pages import page_named
from attn_explorer.gui.window.toolbar import HF_ID, OPEN_FOLDER


def build_menus(window) -> None:
    """The File and View menus of `window`, with their shortcuts, calling the actions it holds."""
    files, toolbar, st = window.file_actions, window.toolbar, window.state
    mb = window.menuBar()
    file = mb.addMenu("&File")
    # Ctrl+O / Ctrl+S open and save a session (below); an image is Ctrl+I, an export Ctrl+E
    files.act_open = add_action(window, file, "&Open image…", files.open_image_dialog, "Ctrl+I")
    files.act_open_text = add_action(window, file, "Open &text file…", files.open_text_dialog, "Ctrl+Shift+O")
    add_action(window, file, OPEN_FOLDER, files.open_model_folder_dialog)
    add_action(window, file, HF_ID, files.hf_id_dialog)
    if getattr(window, "pin", None) is not None:
        file.addAction(window.pin.action)  # Pin model: also in the model picker's right-click menu
    file.addSeparator()
    window.session_actions.build_menu(file)
    file.addSeparator()
    files.act_export = add_action(window, file, "&Export…", files.export_dialog, "Ctrl+E")
    files.act_export_html = add_action(window, file, "Export page as &HTML…", files.export_html_dialog)
    file.addSeparator()
    # QKeySequence.Quit is empty on some platforms (offscreen, plain X11): name Ctrl+Q as well
    add_action(window, file, "&Quit", window.close, [QKeySequence.Quit, "Ctrl+Q"])
    view = mb.addMenu("&View")
    for i, name in enumerate(window.pages):
        title = page_named(name).title
        add_action(window, view, title, lambda n=name: window.show_page(n), f"Ctrl+{i + 1}" if i < 9 else None)
    view.addSeparator()
    add_action(window, view, "Previous layer", lambda: st.step_layer(-1), "Up")
    add_action(window, view, "Next layer", lambda: st.step_layer(1), "Down")
    add_action(window, view, "Previous head", lambda: st.step_head(-1), "Left")
    add_action(window, view, "Next head", lambda: st.step_head(1), "Right")
    view.addSeparator()
    view.addAction(toolbar.act_dtype_error)


def add_action(window, menu, text, slot, shortcut=None) -> QAction:
    """A menu entry of `window` calling slot(), with its shortcut (or list of them, standard keys included)."""
    act = QAction(text, window)
    if isinstance(shortcut, list):
        keys: list[QKeySequence] = []
        for k in shortcut:
            more = QKeySequence.keyBindings(k) if isinstance(k, QKeySequence.StandardKey) else [QKeySequence(k)]
            keys += [q for q in more if not q.isEmpty() and q not in keys]
        act.setShortcuts(keys)
    elif shortcut is not None:
        act.setShortcut(QKeySequence(shortcut))
    act.triggered.connect(lambda *_: slot())
    menu.addAction(act)
    return act


