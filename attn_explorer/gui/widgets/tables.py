"""Small widgets the lesson pages share: number tables (shaded or editable), a titled matrix, a row
of matrices that wraps to the page's width, and a scrolling page with its explanation on top.

Every number a learner sees sits in a table cell, so tests read exactly what is on screen.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QAbstractItemView, QGridLayout, QHeaderView, QLabel, QLayout, QScrollArea, QSizePolicy,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)
from superqt.utils import signals_blocked

CELL_W, CELL_H = 58, 24  # px: room for "-0.123"
KEPT_NOTE = " (the numbers below are from the last good input)"  # after a bad-input line


def shade(value: float, peak: float, signed: bool) -> QColor:
    """A light background for a cell: blue for positive weight, red for negative (signed tables)."""
    t = 0.0 if peak <= 0 else min(1.0, abs(value) / peak)
    if signed and value < 0:
        return QColor(255, int(255 - 120 * t), int(255 - 120 * t))
    return QColor(int(255 - 150 * t), int(255 - 100 * t), 255)


def number_text(x: float, digits: int) -> str:
    """x with `digits` decimals, and no "-0.00" for a tiny negative number."""
    text = f"{x:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


class NumberTable(QTableWidget):
    """A read-only matrix of numbers, each cell shaded by its size; sized to show every cell."""

    def __init__(self, digits: int = 2, signed: bool = True, per_column: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.digits, self.signed, self.per_column = digits, signed, per_column
        self.plain_rows = 0  # the last rows are totals: left unshaded
        self.values = np.zeros((0, 0))
        self.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.NoSelection)
        self.setFocusPolicy(Qt.NoFocus)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        for header in (self.horizontalHeader(), self.verticalHeader()):
            header.setSectionResizeMode(QHeaderView.Fixed)
            header.setMinimumSectionSize(10)
        self.horizontalHeader().setDefaultSectionSize(CELL_W)
        self.verticalHeader().setDefaultSectionSize(CELL_H)
        self.setSizePolicy(QSizePolicy.Fixed, QSizePolicy.Fixed)

    def set_matrix(self, values, rows: list[str] | None = None, cols: list[str] | None = None) -> None:
        v = np.atleast_2d(np.asarray(values, dtype=np.float64))
        self.values = v
        self.setRowCount(v.shape[0])
        self.setColumnCount(v.shape[1])
        self.setVerticalHeaderLabels(rows or [str(i + 1) for i in range(v.shape[0])])
        self.setHorizontalHeaderLabels(cols or [str(j + 1) for j in range(v.shape[1])])
        body = np.abs(np.nan_to_num(v[: v.shape[0] - self.plain_rows], nan=0.0))
        peaks = body.max(axis=0) if body.size else np.zeros(v.shape[1])
        if not self.per_column:
            peaks = np.full(v.shape[1], peaks.max() if peaks.size else 0.0)
        for i in range(v.shape[0]):
            for j in range(v.shape[1]):
                plain = np.isnan(v[i, j]) or i >= v.shape[0] - self.plain_rows  # NaN: nothing to say
                item = QTableWidgetItem("" if np.isnan(v[i, j]) else number_text(v[i, j], self.digits))
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                item.setBackground(QColor("white") if plain else shade(v[i, j], float(peaks[j]), self.signed))
                item.setForeground(QColor("black"))
                self.setItem(i, j, item)
        self.fit()

    def texts(self) -> list[list[str]]:
        return [[self.item(i, j).text() for j in range(self.columnCount())] for i in range(self.rowCount())]

    def row_labels(self) -> list[str]:
        return [self.verticalHeaderItem(i).text() for i in range(self.rowCount())]

    def fit(self) -> None:
        self.resizeColumnsToContents()
        for j in range(self.columnCount()):
            self.setColumnWidth(j, max(self.columnWidth(j), CELL_W))
        w = self.verticalHeader().sizeHint().width() + self.horizontalHeader().length() + 2 * self.frameWidth()
        h = self.horizontalHeader().sizeHint().height() + self.verticalHeader().length() + 2 * self.frameWidth()
        self.setFixedSize(w, h)


class EditableTable(NumberTable):
    """Numbers the learner types. `edited` fires after any cell changes; `texts()` gives the raw cells."""

    edited = Signal()

    def __init__(self, digits: int = 2, parent: QWidget | None = None):
        super().__init__(digits=digits, signed=True, parent=parent)
        self.setEditTriggers(QAbstractItemView.AllEditTriggers)
        self.setSelectionMode(QAbstractItemView.SingleSelection)
        self.setFocusPolicy(Qt.StrongFocus)
        self.itemChanged.connect(self._changed)

    def set_matrix(self, values, rows: list[str] | None = None, cols: list[str] | None = None) -> None:
        with signals_blocked(self):
            super().set_matrix(values, rows, cols)
            for i in range(self.rowCount()):
                for j in range(self.columnCount()):
                    self.item(i, j).setBackground(QColor("white"))
                    self.item(i, j).setText(_plain(self.values[i, j]))

    def set_cell(self, i: int, j: int, text: str) -> None:
        """Type `text` into a cell, as the learner would (tests, examples)."""
        self.item(i, j).setText(text)

    def _changed(self, _item) -> None:
        self.fit()
        self.edited.emit()


def _plain(x: float) -> str:
    """2.0 -> '2', 0.25 -> '0.25': what a person would type."""
    return f"{x:g}"


class MatrixBox(QWidget):
    """A title over a table: 'W_Q (4×4)'."""

    def __init__(self, title: str, table: NumberTable, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = QLabel(title)
        self.title.setTextFormat(Qt.RichText)
        self.table = table
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 8, 6)
        lay.setSpacing(2)
        lay.addWidget(self.title)
        lay.addWidget(table)
        lay.addStretch(1)


class WrapRow(QWidget):
    """Widgets in rows that wrap to the available width (1024×700: a few per row; 1920×1080: all)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.items: list[QWidget] = []
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setSizeConstraint(QLayout.SetNoConstraint)  # narrower than one row: wrap, do not widen
        self.grid.setHorizontalSpacing(6)
        self._cols = 0

    def add(self, w: QWidget) -> QWidget:
        self.items.append(w)
        self._cols = 0
        self._arrange(self.width())
        return w

    def clear(self) -> None:
        for w in self.items:
            self.grid.removeWidget(w)
            w.deleteLater()
        self.items = []
        self._cols = 0

    def _arrange(self, width: int) -> None:
        if not self.items:
            return
        widest = max(w.sizeHint().width() for w in self.items) + self.grid.horizontalSpacing()
        cols = max(1, min(len(self.items), max(width, 1) // max(widest, 1)))
        if cols == self._cols:
            return
        self._cols = cols
        for w in self.items:
            self.grid.removeWidget(w)
        for c in range(self.grid.columnCount()):
            self.grid.setColumnStretch(c, 0)
        for k, w in enumerate(self.items):
            self.grid.addWidget(w, k // cols, k % cols, Qt.AlignLeft | Qt.AlignTop)
        self.grid.setColumnStretch(cols, 1)
        self.updateGeometry()

    def refit(self) -> None:
        """Re-wrap after the items changed size."""
        self._cols = 0
        self._arrange(self.width())

    def minimumSizeHint(self):  # noqa: N802
        widest = max((w.sizeHint().width() for w in self.items), default=0)
        return QSize(widest, self.grid.sizeHint().height())

    def sizeHint(self):  # noqa: N802
        return QSize(self.grid.sizeHint().width(), self.grid.sizeHint().height())

    def resizeEvent(self, ev):  # noqa: N802
        super().resizeEvent(ev)
        self._arrange(ev.size().width())


def explanation(html: str) -> QLabel:
    lab = QLabel(html)
    lab.setWordWrap(True)
    lab.setTextFormat(Qt.RichText)
    lab.setTextInteractionFlags(Qt.TextSelectableByMouse)
    return lab


def scrolling_page(owner: QWidget) -> QVBoxLayout:
    """Give `owner` a vertical scroll area; returns the layout to fill (the page never forces the window taller)."""
    inner = QWidget()
    lay = QVBoxLayout(inner)
    lay.setContentsMargins(8, 6, 8, 6)
    scroll = QScrollArea()
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QScrollArea.NoFrame)
    scroll.setWidget(inner)
    outer = QVBoxLayout(owner)
    outer.setContentsMargins(0, 0, 0, 0)
    outer.addWidget(scroll)
    owner.scroll = scroll
    return lay


class MessageLabel(QLabel):
    """The page's one line for bad input (red); hidden while there is nothing to say."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("", parent)
        self.setWordWrap(True)
        self.setStyleSheet("color: #b00020; font-weight: bold;")
        self.hide()

    def setText(self, text: str) -> None:  # noqa: N802
        super().setText(text)
        self.setVisible(bool(text))


def message_label() -> QLabel:
    return MessageLabel()
