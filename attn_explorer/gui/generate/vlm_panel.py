"""The Generate page's picture (issue 26 B): with a vision-language model open, each new word's attention to the
image tokens is drawn on the picture as it is written, and the words written are links: clicking one shows the
overlay of the step that wrote it (the row of the query that chose it), until Generate runs again.

Only drawing here: each step's row is put back on the picture by session.vlm_generation.step_overlay (NumPy on
the step's plain arrays). The heat runs from 0 to the map's 98th percentile, mixed with the picture at the
window's overlay opacity, as on the Overlay page.
"""
from __future__ import annotations

from html import escape
from typing import Any, Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Signal
from PySide6.QtWidgets import QComboBox, QLabel, QSizePolicy, QTextBrowser, QVBoxLayout, QWidget

from attn_explorer.gui.widgets.heatmap import colormap, set_bar_label
from attn_explorer.gui.widgets.overlay import blend, heat_label, heat_levels
from attn_explorer.gui.widgets.tokens import token_text
from attn_explorer.session.vlm import AVERAGES
from attn_explorer.session.vlm_generation import StepOverlay, step_overlay

HINT = ("Press Generate: the model writes after the picture and the prompt, and each new word's attention to the "
        "image tokens is drawn on the picture as it is written. Click a word afterwards to see where it looked.")


def weights_words(info: Any) -> str:
    """What is known about the weights, in one sentence: random, or not known to be trained (a folder)."""
    if info is None:
        return ""
    if not info.trained:
        return "<b>Untrained model (random weights): patterns mean nothing.</b>"
    if info.weights.startswith("from "):  # a folder or hub id: where from, not whether trained
        return (f"Weights {escape(info.weights, quote=False)}: the app cannot tell whether they were trained; the "
                "tiny test models hold <b>random weights</b> (patterns mean nothing).")
    return ""


class VlmGenerationPanel(QWidget):
    """The picture with one step's attention, the words written (links) and the choice of heads drawn.
    `selection()` gives the (layer, head) the page's spin boxes hold."""

    step_chosen = Signal(int)  # a word was clicked: its step's index

    def __init__(self, selection: Callable[[], tuple[int, int]], options: Callable[[], tuple[float, str]],
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.selection, self.options = selection, options
        self.prompt = None  # session.vlm_generation.VlmPromptInfo of the generation shown
        self.steps: list = []
        self.shown: int | None = None  # the step drawn
        self.pinned = False  # a word was clicked: new steps no longer move the picture
        self.overlay: StepOverlay | None = None
        self.info: Any = None
        self.edited = False  # the prompt box changed since this generation started

        self.average = QComboBox()
        for key, words in AVERAGES.items():
            self.average.addItem(words, key)
        self.average.setCurrentIndex(self.average.findData("all"))
        self.average.setToolTip("Which attention is drawn on the picture: the selected head, the selected layer's "
                                "heads averaged, or every layer and head averaged")
        self.average.currentIndexChanged.connect(lambda *_: self.redraw())
        self.words = QTextBrowser()
        self.words.setOpenLinks(False)
        self.words.setMaximumHeight(40)
        self.words.setToolTip("the words written: click one to draw where it looked in the picture")
        self.words.anchorClicked.connect(lambda url: self.choose(int(url.toString())))
        self.canvas = pg.GraphicsLayoutWidget()
        self.canvas.setBackground("w")
        self.plot = self.canvas.addPlot(row=0, col=0)
        self.plot.invertY(True)
        self.plot.setAspectLocked(True)
        for side in ("left", "bottom"):
            self.plot.hideAxis(side)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), interactive=False, width=14)
        self.colorbar.axis.enableAutoSIPrefix(False)
        self.canvas.addItem(self.colorbar, row=0, col=1)
        self.caption = QLabel(HINT)
        self.caption.setWordWrap(True)
        self.caption.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.words)
        lay.addWidget(self.canvas, 1)
        lay.addWidget(self.caption)

    # ------------------------------------------------------------------ from the page
    def clear(self, note: str = "") -> None:
        """Nothing written: no picture, no words, the hint (or what cleared it)."""
        self.prompt, self.steps, self.shown, self.pinned, self.overlay, self.edited = None, [], None, False, None, False
        self.image.clear()
        self.plot.setTitle("")
        self.words.setHtml("")
        self.caption.setText(note or HINT)

    def set_prompt(self, prompt) -> None:
        self.prompt = prompt
        n_img = len(prompt.image_token_positions)
        self.caption.setText(f"The picture and the prompt: {n_img:,} image tokens + {len(prompt.ids) - n_img:,} "
                             "text tokens; the first word is on its way. " + weights_words(self.info))
        self._show_picture(prompt.image)

    def add_step(self, step) -> None:
        self.steps.append(step)
        if not self.pinned:
            self.shown = len(self.steps) - 1
        self._words()
        self.redraw()

    def choose(self, index: int) -> None:
        """Show the overlay of the step that wrote word `index` (a click on it)."""
        if 0 <= index < len(self.steps):
            self.pinned, self.shown = True, index
            self._words()
            self.redraw()
            self.step_chosen.emit(index)

    def prompt_edited(self) -> None:
        """The prompt box changed: the words and picture shown were written after the old one; say so."""
        if self.steps and not self.edited:
            self.edited = True
            self.redraw()

    # ------------------------------------------------------------------ drawing
    def _words(self) -> None:
        parts = []
        for i, s in enumerate(self.steps):
            shown = escape(token_text(s.token), quote=False)
            style = "background:#ffd54f;color:black;" if i == self.shown else "color:#1a4fa0;"
            parts.append(f'<a href="{i}" style="{style}text-decoration:none">{shown}</a>')
        self.words.setHtml("<span style='font-family:monospace'>" + " ".join(parts) + "</span>")

    def _show_picture(self, picture: np.ndarray) -> None:
        h, w = picture.shape[:2]
        self.image.setImage(picture, levels=(0, 255), autoLevels=False)
        self.image.setRect(QRectF(0, 0, w, h))
        self.plot.setRange(xRange=(0, w), yRange=(0, h), padding=0.02)

    def redraw(self) -> None:
        """Draw the step shown with the heads chosen (the page's layer and head, the average box)."""
        if self.prompt is None or self.shown is None or self.shown >= len(self.steps):
            return
        step = self.steps[self.shown]
        layer, head = self.selection()
        avg = self.average.currentData() or "all"
        got = self.overlay = step_overlay(step, self.prompt, layer, head, avg)
        alpha, cmap = self.options()
        rgb = blend(self.prompt.image, got.picture, alpha, cmap, False, False)
        self._show_picture(rgb)
        self.colorbar.setColorMap(colormap(cmap))
        self.colorbar.setLevels(values=heat_levels(got.picture, False)[1])
        set_bar_label(self.colorbar, heat_label("weight", False))
        where = {"head": f"layer {layer}, head {head}", "layer": f"layer {layer}, heads averaged",
                 "all": "every layer and head averaged"}[avg]
        self.plot.setTitle(f"word {self.shown + 1} {escape(token_text(step.token), quote=False)}: {where}",
                           color="k", size="9pt")
        self.caption.setText(self._caption(step, got, avg))

    def _caption(self, step, got: StepOverlay, avg: str) -> str:
        n_img = len(self.prompt.image_token_positions)
        where = ""
        if got.global_weight:
            where += f" ({got.global_weight:.3f} of it on the global view, not drawn: the tiles are)"
        if got.cls:
            where += f" ({got.cls:.3f} on the tower's class token, which has no place)"
        live = ("" if self.pinned else " Drawn as each word is written; click a word to keep one.")
        stale = (" <i>The prompt box was edited since: this was written after the prompt before; press Generate "
                 "to write after the new one.</i>" if self.edited else "")
        return (f"Writing <b>{escape(repr(step.token), quote=False)}</b> (word {step.index + 1}), the model put "
                f"{got.total:.3f} of its attention on the {n_img:,} image tokens{where} ({AVERAGES[avg]})."
                f"{live}{stale} {weights_words(self.info)}")
