"""The train-vit page's strip: a few fixed held-out images, and under each where [CLS] looks.

Each attention map is the [CLS] row of the last block's attention, averaged over the heads, one square
per patch, laid exactly under the pixels of that patch. Its colour is the weight times the number of
patches: 1 means the equal share every patch would get if [CLS] looked everywhere alike, 3 means three
times that. The scale is fixed (0 to 4), so a map that sharpens during training visibly changes colour.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

LEVELS = (0.0, 4.0)  # attention × number of patches
GAP = 0.3  # between columns and rows, as a fraction of the image side


class AttentionStrip(QWidget):
    """set_examples(images, true, classes) once per run; set_attention(maps, predicted, step) as it trains."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = QLabel("")
        self.title.setWordWrap(True)
        self.view = pg.GraphicsLayoutWidget()
        self.view.setMinimumHeight(230)
        self.view.setMaximumHeight(300)
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
            "each: how much [CLS] looks at every patch in the last block, averaged over the heads. Colour: the "
            "weight × the number of patches, so 1 is an equal share and brighter means 'looks here more'.")
        self.caption.setWordWrap(True)
        self.caption.setStyleSheet("color: #555;")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.title)
        lay.addWidget(self.view)
        lay.addWidget(self.caption)
        self.images: list[pg.ImageItem] = []
        self.maps: list[pg.ImageItem] = []
        self.texts: list[pg.TextItem] = []
        self.true = np.zeros(0, np.int64)
        self.classes: tuple[str, ...] = ()
        self.side = 0
        self.xs: list[float] = []
        self.attention: np.ndarray | None = None  # what is drawn, (k, rows, cols) in "× equal share"
        self.predicted: np.ndarray | None = None
        self.step: int | None = None
        self.clear()

    def clear(self) -> None:
        for item in self.images + self.maps + self.texts:
            self.box.removeItem(item)
        self.images, self.maps, self.texts = [], [], []
        self.attention = self.predicted = self.step = None
        self.title.setText("<b>Where [CLS] looks</b>: appears when training starts.")

    def set_examples(self, images: np.ndarray, true: np.ndarray, classes: tuple[str, ...]) -> None:
        """images (k, side, side, 3) uint8."""
        self.clear()
        self.true, self.classes = np.asarray(true), tuple(classes)
        k, side = len(images), images.shape[1]
        self.side = side
        gap = GAP * side
        self.xs = [i * (side + gap) for i in range(k)]
        for i in range(k):
            x = i * (side + gap)
            img = pg.ImageItem(np.ascontiguousarray(images[i]), axisOrder="row-major")
            img.setRect(QRectF(x, 0, side, side))
            att = pg.ImageItem(axisOrder="row-major")  # placed once it has a map (setRect needs its shape)
            text = pg.TextItem("", color="#222", anchor=(0.5, 0))
            text.setPos(x + side / 2, 2 * side + gap)
            for item in (img, att, text):
                self.box.addItem(item)
            self.images.append(img)
            self.maps.append(att)
            self.texts.append(text)
        self.colorbar.setImageItem(self.maps)
        self.box.setRange(QRectF(-gap / 2, -gap / 2, k * (side + gap), 2 * side + 2.6 * gap), padding=0)

    def set_attention(self, maps: np.ndarray, predicted: np.ndarray, step: int) -> None:
        """maps (k, rows, cols): [CLS]'s weights on the patches; predicted (k,) class indices."""
        shares = maps * maps.shape[1] * maps.shape[2]
        self.attention, self.predicted, self.step = shares, np.asarray(predicted), step
        for i, item in enumerate(self.maps):
            item.setImage(np.ascontiguousarray(shares[i], dtype=np.float32), levels=LEVELS)
            item.setRect(QRectF(self.xs[i], self.side * (1 + GAP), self.side, self.side))  # after setImage: fits its shape
            ok = int(predicted[i]) == int(self.true[i])
            self.texts[i].setText(f"{self._name(self.true[i])} → {self._name(predicted[i])} {'✓' if ok else '✗'}")
            self.texts[i].setColor("#1a7f37" if ok else "#b00020")
        self.colorbar.setLevels(LEVELS)
        when = "before training (random weights)" if step == 0 else f"after step {step}"
        self.title.setText(f"<b>Where [CLS] looks</b>, {when}: true class → the model's answer")

    def _name(self, c) -> str:
        c = int(c)
        return self.classes[c] if 0 <= c < len(self.classes) else str(c)
