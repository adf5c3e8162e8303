"""The head page's colour scale: the choice of scale (the weights, each row scaled to its max, or a
percentile clip with sink columns left blank; session.long_view.colour_scale) and the line under the map
that says which is on and which sink keys it left blank."""
from __future__ import annotations

import html

from PySide6.QtWidgets import QComboBox, QWidget

from attn_explorer.session.long_view import COLOUR_NAMES, COLOUR_SCALES, Window


class ColourScaleBox(QComboBox):
    """The colour scale's choice; each item's data is the scale's key in COLOUR_SCALES."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        for key in COLOUR_SCALES:
            self.addItem(COLOUR_NAMES[key], key)
        self.setToolTip("Colour: the weights themselves (comparable across heads); each row scaled to "
                        "its own max (a row that spreads its weight reads as well as one that gives it "
                        "to a sink); or 0 to the 99th percentile with sink columns left blank")

    def show_scale(self, key: str) -> None:
        """Show the session's scale (a change made elsewhere: the menu, a saved session)."""
        i = self.findData(key)
        if i >= 0 and i != self.currentIndex():
            self.setCurrentIndex(i)


def sink_keys(sinks, win: Window | None, col_tokens: list[str]) -> list[str]:
    """The first four sink columns by name: in a long map's window the keys each pooled column spans
    ("1,024–1,031"), in a map drawn whole the key's number and token ('3 "."')."""
    if win is not None:
        return [f"{win.col_edges[j]:,}" + (f"–{win.col_edges[j + 1] - 1:,}"
                                           if win.col_edges[j + 1] - win.col_edges[j] > 1 else "")
                for j in sinks[:4]]
    keys = [f"{j:,}" for j in sinks[:4]]
    names = [col_tokens[j] for j in sinks[:4] if j < len(col_tokens)]
    return [f'{k} "{html.escape(t)}"' for k, t in zip(keys, names)]


def scale_text(scaled, win: Window | None, col_tokens: list[str], specials_kept: bool) -> str:
    """The label under the map: the scale's name, the sink keys it left blank and their share of the weight,
    and (specials_kept: a long map while "Hide special tokens" is on) that the specials are still drawn."""
    text = f"Colour: <b>{html.escape(scaled.label, quote=False)}</b>"
    if scaled.sinks.size:
        keys = sink_keys(scaled.sinks, win, col_tokens)
        text += (f" — sink key{'s' if len(keys) > 1 else ''} {', '.join(keys)} left blank: "
                 f"{scaled.sink_share:.0%} of these rows' weight on average")
    if specials_kept:
        text += " — <i>Hide special tokens applies to inputs up to the windowed length only</i>"
    return text
