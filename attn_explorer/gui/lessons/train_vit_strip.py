"""The train-vit page's strip: a few fixed held-out images, and under each where [CLS] looks.

Each attention map is the [CLS] row of one block's attention (block 1 by default, where the trained
tiny-vit-digits model puts most of [CLS]'s attention on the ink; a menu picks another), averaged over the heads, one square per patch, laid exactly under the pixels of that patch.
Its colour is the weight times the number of patches: 1 means the equal share every patch would get if
[CLS] looked everywhere alike, 3 means three times that. The scale is fixed (0 to 3), so a map that
sharpens during training visibly changes colour. The title says how much of the attention goes to the
patches that hold ink, against the share of such patches.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget
from superqt.utils import signals_blocked

LEVELS = (0.0, 3.0)  # attention × number of patches
FIRST_BLOCK = 0  # the block shown first: the lesson's text names block 1 (see the module's docstring)
GAP = 0.3  # between columns and rows, as a fraction of the image side
NARROW_PX = 640  # narrower strips put the examples in two rows


class AttentionStrip(QWidget):
    """set_examples(images, true, classes) once per run; set_attention(maps, predicted, step, ink, inked) as it trains."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = QLabel("")
        self.title.setWordWrap(True)
        self.block = QComboBox()
        self.block.setToolTip("Which block's attention to show (each block has its own heads)")
        self.block.currentIndexChanged.connect(lambda _: self._draw())
        self.block.hide()  # until there is attention to show
        self.view = pg.GraphicsLayoutWidget()
        self.view.setMinimumHeight(170)
        self.view.setMaximumHeight(380)
        self.box = self.view.addViewBox(row=0, col=0)
        self.box.setAspectLocked(True)
        self.box.invertY(True)
        self.box.setMouseEnabled(False, False)
        self.box.setMenuEnabled(False)
        self.colorbar = pg.ColorBarItem(values=LEVELS, colorMap=pg.colormap.get("viridis"), interactive=False,
                                        label="× equal share")
        self.view.addItem(self.colorbar, row=0, col=1)
        self.caption = QLabel(
            "Top: the held-out images, with their true class and the model's answer (✓ right, ✗ wrong). Below "
            "each: how much [CLS] looks at every patch in the chosen block, averaged over the heads. Colour: the "
            "weight × the number of patches, so 1 is an equal share and brighter means 'looks here more'.")
        self.caption.setWordWrap(True)
        self.caption.setStyleSheet("color: #555;")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.block, 0, Qt.AlignTop)
        lay.addLayout(top)
        lay.addWidget(self.view)
        lay.addWidget(self.caption)
        self.images: list[pg.ImageItem] = []
        self.maps: list[pg.ImageItem] = []
        self.texts: list[pg.TextItem] = []
        self.true = np.zeros(0, np.int64)
        self.classes: tuple[str, ...] = ()
        self.side = 0
        self.corners: list[tuple[float, float]] = []  # top-left of each example's image, in view units
        self.maps_all: np.ndarray | None = None  # (k, L, rows, cols) as the trainer sent it
        self.attention: np.ndarray | None = None  # what is drawn: (k, rows, cols) of the chosen block, × equal share
        self.predicted: np.ndarray | None = None
        self.step: int | None = None
        self.ink: np.ndarray | None = None  # (L,)
        self.inked = 0.0
        self.clear()

    def clear(self) -> None:
        for item in self.images + self.maps + self.texts:
            self.box.removeItem(item)
        self.images, self.maps, self.texts = [], [], []
        self.maps_all = self.attention = self.predicted = self.step = self.ink = self.when = None
        if hasattr(self, "block"):
            self.block.hide()
        self.title.setText("<b>Where [CLS] looks</b>: appears when training starts.")

    def set_examples(self, images: np.ndarray, true: np.ndarray, classes: tuple[str, ...]) -> None:
        """images (k, side, side, 3) uint8."""
        self.clear()
        self.true, self.classes = np.asarray(true), tuple(classes)
        self.side = images.shape[1]
        for i in range(len(images)):
            img = pg.ImageItem(np.ascontiguousarray(images[i]), axisOrder="row-major")
            att = pg.ImageItem(axisOrder="row-major")  # placed once it has a map (setRect needs its shape)
            text = pg.TextItem("", color="#222", anchor=(0.5, 0))
            for item in (img, att, text):
                self.box.addItem(item)
            self.images.append(img)
            self.maps.append(att)
            self.texts.append(text)
        self.colorbar.setImageItem(self.maps)
        self._place()

    def columns(self) -> int:
        """All examples in one row when there is room, else rows of half as many (they stay legible)."""
        k = len(self.images)
        return k if self.width() >= NARROW_PX or k < 4 else (k + 1) // 2

    def _place(self) -> None:
        """Each example is an image with its map under it and its label under that, in a grid of columns()."""
        k, side = len(self.images), self.side
        if not k:
            return
        cols = self._cols = self.columns()
        gap = GAP * side
        cell_h = 2 * side + 2.6 * gap  # image, gap, map, room for the label
        self.corners = [((i % cols) * (side + gap), (i // cols) * cell_h) for i in range(k)]
        for i, (x, y) in enumerate(self.corners):
            self.images[i].setRect(QRectF(x, y, side, side))
            self.texts[i].setPos(x + side / 2, y + 2 * side + gap)
            if self.maps[i].image is not None:
                self.maps[i].setRect(QRectF(x, y + side + gap, side, side))
        rows = (k + cols - 1) // cols
        self.box.setRange(QRectF(-gap / 2, -gap / 2, cols * (side + gap), rows * cell_h), padding=0)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if self.images and self.columns() != getattr(self, "_cols", None):
            self._place()

    def set_attention(self, maps: np.ndarray, predicted: np.ndarray, step: int, ink: np.ndarray | None = None,
                      inked: float = 0.0, when: str | None = None) -> None:
        """maps (k, L, rows, cols): [CLS]'s weights on the patches per block; predicted (k,) class indices;
        ink (L,) share of the weight on patches with ink, inked the share of such patches; when: how the
        title names the moment (default: before training / after step N)."""
        self.maps_all, self.predicted, self.step = maps, np.asarray(predicted), step
        self.ink, self.inked, self.when = ink, inked, when
        L = maps.shape[1]
        if self.block.count() != L:
            with signals_blocked(self.block):
                self.block.clear()
                self.block.addItems([f"block {i + 1}" + (" (last)" if i == L - 1 else "") for i in range(L)])
                self.block.setCurrentIndex(min(FIRST_BLOCK, L - 1))
        self.block.show()
        self._draw()

    def _draw(self) -> None:
        if self.maps_all is None:
            return
        b = max(0, self.block.currentIndex())
        maps = self.maps_all[:, b]
        shares = maps * maps.shape[1] * maps.shape[2]
        self.attention = shares
        for i, item in enumerate(self.maps):
            item.setImage(np.ascontiguousarray(shares[i], dtype=np.float32), levels=LEVELS)
            x, y = self.corners[i]
            item.setRect(QRectF(x, y + self.side * (1 + GAP), self.side, self.side))  # after setImage: fits its shape
            ok = int(self.predicted[i]) == int(self.true[i])
            self.texts[i].setText(f"{self._name(self.true[i])} → {self._name(self.predicted[i])} {'✓' if ok else '✗'}")
            self.texts[i].setColor("#1a7f37" if ok else "#b00020")
        self.colorbar.setLevels(LEVELS)
        when = self.when or ("before training (random weights)" if self.step == 0 else f"after step {self.step}")
        text = f"<b>Where [CLS] looks</b> in block {b + 1}, {when}; under each image: true class → the model's answer."
        if self.ink is not None:
            text += (f"<br>[CLS] gives <b>{100 * self.ink[b]:.0f} %</b> of its attention to the patches that hold "
                     f"ink, which are {100 * self.inked:.0f} % of the patches (looking everywhere alike would give "
                     f"{100 * self.inked:.0f} %).")
        self.title.setText(text)

    def _name(self, c) -> str:
        c = int(c)
        return self.classes[c] if 0 <= c < len(self.classes) else str(c)
