"""Pin model (issue 24 D, memory): keep the model loaded now in memory when another is chosen.

A model switch frees the old model before the new one is read (session.host), so that MiniLM → SmolLM2 → Gemma
on one long text needs about what Gemma alone does. A user who goes back and forth between two models pins one:
it stays in memory, and a switch back to it reads nothing. The toggle sits in the model picker's right-click
menu and in the File menu; the pinned models are saved in the settings ("model/pinned") and pinned again when
they are next loaded.
"""
from __future__ import annotations

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction

from attn_explorer.session.state import SessionState

PIN_TEXT = "Pin model (keep it in memory when switching)"
PIN_TIP = ("Keep this model in memory when another is chosen: switching back is instant. Unpinned, a switch frees "
           "it (and the queries and keys its long runs kept) before the next model is read")


class PinToggle:
    """The checkable "Pin model" action, in the model picker's context menu; saved in the settings."""

    KEY = "model/pinned"

    def __init__(self, window, state: SessionState, settings: QSettings, combo=None) -> None:
        self.state, self.settings = state, settings
        self.action = QAction(PIN_TEXT, window)
        self.action.setCheckable(True)
        self.action.setEnabled(False)
        self.action.setToolTip(PIN_TIP)
        self.action.setStatusTip(PIN_TIP)
        self.action.toggled.connect(self._toggled)
        if combo is not None:  # right-click on the model picker
            combo.setContextMenuPolicy(Qt.ActionsContextMenu)
            combo.addAction(self.action)
        state.model_loaded.connect(self._loaded)
        state.pin_changed.connect(self._show)

    def saved(self) -> list[str]:
        value = self.settings.value(self.KEY, [])
        if isinstance(value, str):
            value = [value] if value else []
        return [str(v) for v in (value or [])]

    def _source(self) -> str:
        info = self.state.info
        return str(self.state.host.source or (info.name if info is not None else ""))

    def _loaded(self, info) -> None:
        self.action.setEnabled(True)
        if not self.state.pinned and self._source() in self.saved():
            self.state.set_pinned(True)  # pinned in an earlier session
        self._show(self.state.pinned)

    def _show(self, on: bool) -> None:
        if self.action.isChecked() != bool(on):
            self.action.blockSignals(True)
            self.action.setChecked(bool(on))
            self.action.blockSignals(False)

    def _toggled(self, on: bool) -> None:
        if self.state.info is None:
            return
        self.state.set_pinned(on)
        names, src = self.saved(), self._source()
        names = [n for n in names if n != src] + ([src] if on else [])
        self.settings.setValue(self.KEY, names)
