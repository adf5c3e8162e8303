"""The Cost page's tables: every measured point, and the variants on the model's own q, k, v."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QPushButton, QSizePolicy,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from attn_explorer.gui.widgets.stats import work_line

ERROR_HEADER = "relative error of the output vs exact"
ERROR_TIP = ("‖out − exact‖ / ‖exact‖: the size of the difference between this variant's output and exact "
             "attention's output for the same q, k, v, as a share of the exact output's size (Frobenius norms). "
             "0 means identical; 1 means the error is as large as the answer itself.")
FAILED_COLOUR = "#b00020"


def _table(headers: list[str]) -> QTableWidget:
    return _setup(QTableWidget(0, len(headers)), headers)


def _setup(table: QTableWidget, headers: list[str]) -> QTableWidget:
    table.setHorizontalHeaderLabels(headers)
    table.verticalHeader().setVisible(False)
    table.verticalHeader().setDefaultSectionSize(22)
    table.setEditTriggers(QAbstractItemView.NoEditTriggers)
    table.setSelectionMode(QAbstractItemView.NoSelection)
    table.setWordWrap(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeToContents)
    header.setStretchLastSection(True)
    return table


def _set_row(table: QTableWidget, row: int, cells: list[str], colour: str | None, failed: bool,
             name_col: int = 1, text_cols: tuple[int, ...] = ()) -> None:
    """One row: numbers right-aligned; the variant's name (column name_col) in its colour."""
    for col, text in enumerate(cells):
        item = QTableWidgetItem(text)
        if col != name_col and col not in text_cols:
            item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
        if col == name_col and colour:
            item.setForeground(QBrush(QColor(colour)))
        if failed:
            item.setForeground(QBrush(QColor(FAILED_COLOUR)))
        table.setItem(row, col, item)


def _beside(beside: dict | None) -> str:
    """A point's note when other work ran while it was measured (session.cost_sweep): which, and how long."""
    return f"measured beside other work: {work_line(beside)}" if beside else ""


class ResultsTable(QTableWidget):
    """One row per (n, variant), replaced when that point is measured again."""

    HEADERS = ["n", "variant", "median\nms", "fastest–\nslowest ms", "peak\nMB", "relative error of\nthe output vs exact",
               "note"]
    ERROR_COLUMN = 5

    def __init__(self, variants: dict[str, dict], parent: QWidget | None = None):
        super().__init__(0, len(self.HEADERS), parent)
        _setup(self, self.HEADERS)
        self.horizontalHeaderItem(self.ERROR_COLUMN).setToolTip(
            ERROR_TIP + " Here on random q, k, v: random queries spread their attention over every key, so a "
            "local window misses most of it. See the model's own q, k, v beside this table.")
        self.variants = variants

    def put(self, rec: dict) -> None:
        """Show one Measurement dict, replacing the row of the same (n, variant)."""
        key = (f"{rec['n']:,}", rec["impl"])
        row = next((r for r in range(self.rowCount())
                    if (self.item(r, 0).text(), self.item(r, 1).text()) == key), None)
        if row is None:
            row = self.rowCount()
            self.insertRow(row)
        ok = rec["status"] == "ok"
        err = rec.get("rel_error")
        if not ok:
            err_text = "–"
        elif rec.get("reference") is None and self.variants.get(rec["impl"], {}).get("exact") and err is None:
            err_text = "reference"
        else:
            err_text = f"{err:.2e}" if err is not None else "–"
            if err is not None and rec.get("reference") not in (None, "naive"):
                err_text += f" (vs {rec['reference']})"
        spread = (f"{rec['ms_min']:.3g}–{rec['ms_max']:.3g}" if ok and rec.get("ms_min") is not None else "–")
        cells = [key[0], rec["impl"], f"{rec['ms']:.3g}" if ok else "–", spread,
                 f"{rec['peak_bytes'] / 1e6:.3g}" if ok and rec.get("peak_bytes") is not None else "–", err_text,
                 _beside(rec.get("beside")) if ok else (rec.get("message") if rec["status"] == "skipped"
                                                        else f"failed: {rec.get('message') or 'unknown error'}")]
        _set_row(self, row, cells, self.variants.get(rec["impl"], {}).get("colour"), not ok,
                 text_cols=(len(cells) - 1,))
        self.scrollToItem(self.item(row, 0))


class QKVPanel(QWidget):
    """The variants on the model's own q, k, v for the input on screen, next to random ones."""

    measure_requested = Signal()
    HEADERS = ["variant", "relative error on\nthe model's q, k, v", "relative error on\nrandom q, k, v", "median\nms"]

    def __init__(self, variants: dict[str, dict], parent: QWidget | None = None):
        super().__init__(parent)
        self.variants = variants
        self.title = QLabel("<b>On the model's own q, k, v</b>")
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        self.button = QPushButton("Measure")
        self.button.setToolTip("take q, k and v from the selected layer for the input on screen, and run every "
                               "ticked variant on them and on random q, k, v of the same shape")
        self.table = _table(self.HEADERS)
        for col in (1, 2):
            self.table.horizontalHeaderItem(col).setToolTip(ERROR_TIP)
        self.table.setMinimumHeight(50)
        self.caption.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Minimum)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.setSpacing(2)
        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.button)
        lay.addLayout(top)
        lay.addWidget(self.caption)
        lay.addWidget(self.table, 1)
        self.button.clicked.connect(self.measure_requested)
        self.set_target("")

    def set_target(self, target: str) -> None:
        """What a measurement would use now ('' when no model is loaded). Clears a stale table."""
        self.button.setEnabled(bool(target))
        if not target:
            self.caption.setText("Load a model in the explorer to measure the variants on its own q, k, v.")
        elif self.table.rowCount() == 0:
            self.caption.setText(f"Measure on {target}.")

    def set_busy(self) -> None:
        self.button.setEnabled(False)
        self.caption.setText("measuring on the model's q, k, v…")

    def clear(self, target: str = "") -> None:
        self.table.setRowCount(0)
        self.title.setText("<b>On the model's own q, k, v</b>")
        self.set_target(target)

    def show_result(self, result: dict) -> None:
        self.title.setText(f"<b>On the model's own q, k, v</b> (layer {result['layer']}, this input)")
        w = result["window"]
        why = "" if w == result["window_asked"] else (
            f"; the page's w = {result['window_asked']} covers all {result['n']} tokens, so a quarter of them is used")
        self.caption.setText(f"{result['model']}: {result['heads']} heads × {result['n']} tokens × d_k = "
                             f"{result['d_k']}; window w = {w}{why}. Errors are {ERROR_HEADER} "
                             f"(‖out − exact‖ / ‖exact‖).")
        self.table.setRowCount(0)
        for row, r in enumerate(result["rows"]):
            self.table.insertRow(row)
            fmt = (lambda e: "reference" if e is None else f"{e:.2e}")
            _set_row(self.table, row, [r["impl"], fmt(r["rel_error"]), fmt(r["random_rel_error"]), f"{r['ms']:.3g}"],
                     self.variants.get(r["impl"], {}).get("colour"), False, name_col=0)
        self.button.setEnabled(True)

    def show_error(self, message: str) -> None:
        self.caption.setText(f"failed: {message}")
        self.button.setEnabled(True)
