"""`ScanResults`: a scan's answer on the Switch-off page, every cell's effect as a blue − white + red grid
beside a sortable table of the largest ones. A click on a cell or a row emits `cell_opened(layer, col)`.
A hybrid's layer with fewer heads than the widest (Scan.exists False) is greyed over and opens nothing.
Drawing only; the Scan comes from `session.interventions`."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QSplitter, QTableWidget, QTableWidgetItem

from attn_explorer.gui.interventions.switches import grid_plot, label_cells
from attn_explorer.gui.widgets.heatmap import (CanvasStack, PaintedGraphicsWidget, TokenAxis, cell_centre, cell_under,
                                               colormap)
from attn_explorer.gui.widgets.tokens import token_text
from attn_explorer.session.interventions import SCANS

TOP_ROWS = 40  # table rows of a scan (the largest effects)
HEADERS = ["#", "L", "H", "effect"]
ABSENT_GREY = (150, 150, 150, 255)  # a head its layer does not have (issue 25): neither white (effect 0) nor a colour


class ScanResults(QSplitter):
    cell_opened = Signal(int, int)  # layer, head (or position, for a scan per position)

    def __init__(self, parent=None):
        super().__init__(Qt.Horizontal, parent)
        self.scan = None  # the Scan drawn
        self.canvas = PaintedGraphicsWidget()
        self.axis = TokenAxis("bottom", rotate=True)
        self.plot = grid_plot(self.canvas, self.axis)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.image.setLookupTable(colormap("CET-D1").getLookupTable(0, 1, 256))  # blue − white + red
        self.absent = pg.ImageItem(axisOrder="row-major")  # RGBA over the effect: grey where no such head
        self.plot.addItem(self.absent)
        self.canvas.scene().sigMouseClicked.connect(self._clicked)
        self.stack = CanvasStack(self.canvas, "Run a scan to see every cell's effect here.")
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(HEADERS)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        for j, width in enumerate((34, 34, 38)):
            header.setSectionResizeMode(j, QHeaderView.Fixed)
            header.resizeSection(j, width)
        header.setStretchLastSection(True)
        self.table.setToolTip("# = rank by the size of the effect; L = layer; H = head (or the position, for a "
                              "scan per position). Click a column to sort by it, a row to open that head.")
        self.table.setSortingEnabled(True)
        self.table.setMinimumWidth(190)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.cellClicked.connect(self._row_clicked)
        self.addWidget(self.stack)
        self.addWidget(self.table)
        self.setSizes([420, 190])  # proportions: the splitters share out the room there is

    def drop(self, why: str) -> None:
        """No scan on screen; the grid's place says why (or how to get one)."""
        self.scan = None
        self.stack.show_message(why or "Run a scan to see every head's effect here.")
        self.table.setRowCount(0)
        self.table.setHorizontalHeaderLabels(HEADERS)  # a per-position scan's "pos" goes too
        self.plot.setTitle("")

    def draw(self, s) -> str:
        """Draw a Scan; returns the line that says what was measured and where the largest effect is."""
        self.scan = s
        e = np.nan_to_num(np.asarray(s.effect, dtype=np.float64))
        rows, cols = e.shape
        v = float(np.abs(e).max()) or 1e-6
        self.image.setImage(e.astype(np.float32), levels=(-v, v), autoLevels=False)
        self.image.setRect(0, 0, cols, rows)
        missing = ~np.asarray(s.exists, dtype=bool)
        shade = np.zeros((rows, cols, 4), dtype=np.uint8)
        shade[missing] = ABSENT_GREY
        self.absent.setImage(shade, levels=(0, 255), autoLevels=False)
        self.absent.setRect(0, 0, cols, rows)
        per_position = s.kind == "patch-position"
        label_cells(self.plot, rows, cols, [token_text(t, 8) for t in s.tokens] if per_position else None)
        self.plot.setRange(xRange=(0, cols), yRange=(0, rows), padding=0)
        self.plot.setTitle(SCANS[s.kind][0])
        self.stack.show_canvas()
        self._fill_table(per_position)
        best = s.ranked(1)[0]
        where = f"L{best[0]} @{best[1]} {s.tokens[best[1]]!r}" if per_position else f"L{best[0]} H{best[1]}"
        base = f"clean {s.clean:.4f}" + ("" if s.corrupt is None else f", corrupt {s.corrupt:.4f}")
        return (f"<b>{s.metric}</b>: {base}. Colour and table: {s.effect_label} (red above 0, blue "
                f"below, ±{v:.3g} at full colour); the largest: <b>{where}</b> ({best[2]:+.3f}). "
                f"{s.passes} forward pass{'es' * (s.passes != 1)}." + _absent_words(int(missing.sum())))

    def _fill_table(self, per_position: bool) -> None:
        s = self.scan
        self.table.setSortingEnabled(False)
        self.table.setHorizontalHeaderLabels(["#", "L", "pos" if per_position else "H", "effect"])
        ranked = s.ranked(TOP_ROWS)
        self.table.setRowCount(len(ranked))
        for i, (row, col, effect) in enumerate(ranked):
            for j, value in enumerate((i + 1, row, col, effect)):
                item = QTableWidgetItem()
                item.setData(Qt.DisplayRole, round(value, 4) if j == 3 else int(value))
                if j == 2 and per_position:
                    item.setToolTip(s.tokens[col])
                self.table.setItem(i, j, item)
        self.table.setSortingEnabled(True)
        self.table.sortItems(0, Qt.AscendingOrder)  # the largest |effect| first; any column sorts on a click

    def table_cells(self) -> list[tuple[int, int, float]]:
        """(layer, head or position, effect) of the table's rows, top to bottom as shown."""
        t = self.table
        return [(int(t.item(i, 1).data(Qt.DisplayRole)), int(t.item(i, 2).data(Qt.DisplayRole)),
                 float(t.item(i, 3).data(Qt.DisplayRole))) for i in range(t.rowCount())]

    def centre(self, row: int, col: int):
        """Scene position of a result cell (tests click here)."""
        return cell_centre(self.plot, row, col)

    def _row_clicked(self, row: int, _col: int) -> None:
        layer, col, _ = self.table_cells()[row]
        self.cell_opened.emit(layer, col)

    def _clicked(self, ev) -> None:
        if self.scan is None or ev.button() != Qt.LeftButton:
            return
        hit = cell_under(self.plot, ev.scenePos(), np.shape(self.scan.values))
        if hit is not None and self.scan.exists[hit]:  # a head its layer does not have opens nothing
            self.cell_opened.emit(*hit)


def _absent_words(n: int) -> str:
    return "" if not n else (f" Grey: {n} cell{'s' * (n != 1)} where the layer has no such head (a hybrid's "
                             "narrower layer); a click there opens nothing.")
