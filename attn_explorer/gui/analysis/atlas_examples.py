"""The Atlas page's side panel: a head's numbers and suggested roles, and its top examples as text snippets with
the query and the key marked; clicking one emits `example_chosen(index)`.
"""
from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import QLabel, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

from attn_explorer.gui.analysis.common import untrained_tag

QUERY_STYLE = "background:#ffd54f; font-weight:bold;"  # amber: the query token
KEY_STYLE = "background:#80deea; text-decoration:underline;"  # cyan: the key it looks at
BOTH_STYLE = "background:#c5e1a5; font-weight:bold;"  # the query looks at itself
PERCENT = ("sink", "prev_token", "duplicate", "induction")  # metrics that are shares of weight
UNITS = {"entropy": " bits", "distance": " tokens"}


def metric_value(name: str, v: float) -> str:
    """One metric's value in words: a share as a percentage, entropy in bits, distance in tokens."""
    if v is None or not np.isfinite(v):
        return "n/a"
    return f"{v:.0%}" if name in PERCENT else f"{v:.2f}{UNITS.get(name, '')}"


def hover_line(atlas, layer: int, head: int, first: tuple[str, ...] = ()) -> str:
    """"L3 H5: induction 0.62, prev_token 0.10, …": the metrics named in `first` come first."""
    names = list(dict.fromkeys([*first, *atlas.metrics]))
    vals = ", ".join(f"{n} {float(atlas.metrics[n][layer, head]):.2f}" for n in names if n in atlas.metrics)
    return f"L{layer} H{head}: {vals}"


def _marks_spaces(tokens: list[str]) -> bool:
    """Whether these tokens carry their own word starts (byte-level ' the', SentencePiece '▁the'): then a token
    without one continues the word before it ('TH' 'ES' 'E' 'US' is THESEUS) and pieces join with nothing."""
    return any(t[:1] in (" ", "▁") for t in tokens)


def _piece(t: str, marked: bool) -> tuple[str, bool]:
    """A token as shown, and whether a space goes before it: wordpieces '##ing' join the word before; where the
    tokenizer marks word starts (`marked`), only a marked token starts a word, its mark shown as a space."""
    if t.startswith("##"):
        return t[2:], False
    if marked:
        return (" " + t[1:] if t[:1] == "▁" else t), False
    if t[:1] in (" ", "\n", "\t"):
        return t, False
    return t, True


def snippet_html(tokens: list[str], query_at: int, key_at: int) -> str:
    """The window of tokens as HTML, the query and the key marked (the query in amber, the key in cyan)."""
    out = []
    marked = _marks_spaces(tokens)
    for i, t in enumerate(tokens):
        text, space = _piece(t, marked)
        text = html.escape(text.replace("\n", "⏎").replace("\\n", "⏎"))  # a newline, or its display "\\n"
        style = BOTH_STYLE if i == query_at == key_at else QUERY_STYLE if i == query_at else \
            KEY_STYLE if i == key_at else ""
        if style:
            text = f'<span style="{style}">{text}</span>'
        out.append((" " if space and i else "") + text)
    return "".join(out)


def example_label(ex, doc_name: str = "") -> str:
    """One example's rich text: weight (and the score it ranked by), where it is, the snippet."""
    score = "" if ex.metric == "weight" or not np.isfinite(ex.score) else f", {ex.metric} {ex.score:.2f}"
    where = f"{html.escape(doc_name)}, " if doc_name else f"segment {ex.doc}, "
    head = (f'<span style="color:#555">weight {ex.weight:.2f}{score} · {where}query {ex.query} → key {ex.key}'
            f"</span>")
    return f"{head}<br>{snippet_html(ex.tokens, ex.query_at, ex.key_at)}"


def roles_text(thresholds: dict, atlas=None, roles: dict | None = None, most: int = 6) -> str:
    """Each role's threshold and, with an atlas, the heads that reach it ("induction (induction ≥ 0.3): L1 H0,
    L3 H2"), for the line under the examples; "none" where no head does, "not in this atlas" where the atlas
    has no such metric (retrieval: the retrieval lab measures it)."""
    parts = []
    for role, (metric, t) in thresholds.items():
        heads = [f"L{l} H{h}" for (l, h), rs in sorted((roles or {}).items()) if role in rs]
        more = f" and {len(heads) - most} more" if len(heads) > most else ""
        found = ("" if atlas is None else ": not in this atlas" if metric not in atlas.metrics else
                 f": {', '.join(heads[:most]) or 'none'}{more}")
        parts.append(f"<b>{html.escape(role)}</b> ({metric} ≥ {t:g}){found}")
    return "Suggested roles, where a head's corpus-wide metric reaches the threshold: " + "; ".join(parts) + "."


def atlas_caption(a, source: str, info, documents, bundled: bool, budget: int | None) -> str:
    """The page's caption: the atlas's model, tokens, documents and where it came from (and whether the loaded
    model can open its examples); with no atlas, what the next run reads."""
    untrained = untrained_tag(info)
    if a is None:
        d = documents
        what = (f"next run: {len(d):,} documents from {d.source}" if d is not None else
                "no bundled corpus here: choose a folder or text files" if bundled else
                "the chosen files could not be read")
        return f"<b>Atlas</b> — every head over a corpus; {html.escape(what)}." + untrained
    docs = f"{a.documents:,} document" + ("" if a.documents == 1 else "s")
    cut = (" (stopped early)" if not a.complete else
           " (the token budget ended the run)" if budget is not None and a.tokens >= budget else "")
    other = ("" if info is not None and info.name == a.model else
             f" The loaded model is {html.escape(info.name) if info else 'none'}: examples open only with "
             f"{html.escape(a.model)}.")
    return (f"<b>Atlas</b> of <b>{html.escape(a.model)}</b> — {a.tokens:,} tokens in {docs}{cut}; "
            f"{html.escape(source)}.{other}" + (untrained if not other else ""))


class ExamplePanel(QWidget):
    """The selected head's title, numbers and roles, and its examples (one rich-text row each)."""

    example_chosen = Signal(int)  # the row clicked, an index into `examples`

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = QLabel("Click a head")
        self.title.setTextFormat(Qt.RichText)
        self.numbers = QLabel("")
        self.numbers.setWordWrap(True)
        self.numbers.setTextFormat(Qt.RichText)
        self.list = QListWidget()
        self.list.setToolTip("Its top (query, key) pairs: the query in amber, the key in cyan. "
                             "Click one to open it in the One-head view with that query")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setWordWrap(True)
        self.list.setSpacing(2)
        self.roles = QLabel("")
        self.roles.setWordWrap(True)
        self.roles.setTextFormat(Qt.RichText)
        self.roles.setStyleSheet("color:#555;")
        self.examples: list = []
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        for w in (self.title, self.numbers):
            lay.addWidget(w)
        lay.addWidget(self.list, 1)
        lay.addWidget(self.roles)
        self.list.itemClicked.connect(self._clicked)
        self.list.itemActivated.connect(self._clicked)

    def clear(self, title: str = "Click a head") -> None:
        self.title.setText(title)
        self.numbers.setText("")
        self.list.clear()
        self.examples = []

    def show_head(self, atlas, layer: int, head: int, roles: list[str], examples: list, note: str = "") -> None:
        """The head's metrics, roles and examples (best first)."""
        self.title.setText(f"<b>L{layer} H{head}</b> of {html.escape(atlas.model)}")
        nums = " · ".join(f"{n} {metric_value(n, float(v[layer, head]))}" for n, v in atlas.metrics.items())
        role = ", ".join(roles) if roles else "none reaches its threshold"
        self.numbers.setText(f"{nums}<br><b>suggested role:</b> {html.escape(role)}"
                             + (f"<br><i>{html.escape(note)}</i>" if note else ""))
        self.list.clear()
        self.examples = list(examples)
        for ex in self.examples:
            item = QListWidgetItem()
            label = QLabel(example_label(ex, atlas.sources.get(ex.doc, "")))
            label.setTextFormat(Qt.RichText)
            label.setWordWrap(True)
            label.setAttribute(Qt.WA_TransparentForMouseEvents)  # the click selects the row under it
            label.setContentsMargins(2, 2, 2, 2)
            self.list.addItem(item)
            self.list.setItemWidget(item, label)
            w = self.list.viewport().width() - 6
            item.setSizeHint(QSize(w, label.heightForWidth(w) + 4) if w > 50 else label.sizeHint())
        if not self.examples:
            self.list.addItem("no examples of this kind were kept for this head")

    def resizeEvent(self, event) -> None:  # wrapped rows take the height their new width needs
        super().resizeEvent(event)
        w = self.list.viewport().width() - 6
        for i in range(self.list.count()):
            item = self.list.item(i)
            label = self.list.itemWidget(item)
            if label is not None and w > 50:
                item.setSizeHint(QSize(w, label.heightForWidth(w) + 4))

    def row_of(self, index: int):
        """The list row of example `index` (tests click it)."""
        return self.list.item(index)

    def _clicked(self, item) -> None:
        row = self.list.row(item)
        if 0 <= row < len(self.examples):
            self.example_chosen.emit(row)
