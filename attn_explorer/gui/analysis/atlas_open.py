"""Opening an atlas example in the One-head view: its segment's text goes in the text box (the atlas keeps the
texts its examples point at, so an opened atlas can do it too), and once that text has run, the view shows the
example's head with its query selected. Refused in one banner line where the loaded model is not the atlas's,
or where the run here reads the text otherwise than the atlas's did.
"""
from __future__ import annotations


class ExampleOpener:
    """The open in flight of one `AtlasPage` (`page`): (layer, head, example, text) until its text has run."""

    def __init__(self, page):
        self.page, self.state = page, page.state
        self.pending = None
        self.state.attention_ready.connect(self._ran)

    def open(self, atlas, head: tuple[int, int], ex) -> None:
        info, say = self.state.info, self.state.error_raised.emit
        if info is None or info.name != atlas.model:
            say(f"this atlas is of {atlas.model}; the loaded model is {info.name if info else 'none'}: "
                f"load {atlas.model} to open its examples")
            return
        text = atlas.texts.get(ex.doc)
        if text is None:
            say(f"the atlas has no text for segment {ex.doc}: it cannot be opened again")
            return
        self.pending = (*head, ex, text)
        if self.state.text == text and self.state.result is not None:
            self._ran(self.state.result)
        else:
            self.state.set_text(text)

    def _ran(self, result) -> None:
        if self.pending is None:
            return
        layer, head, ex, text = self.pending
        if self.state.text != text:
            return  # a run of the text before it; the segment's own run follows
        self.pending = None
        say = self.state.error_raised.emit
        if ex.query >= result.num_tokens:
            say(f"the example's query is token {ex.query}; the view ran the first {result.num_tokens:,} tokens "
                "of its text only")
            return
        self.state.set_query(ex.query)
        self.page.open_head(layer, head)
        shown = result.tokens[ex.query]
        if shown != ex.tokens[ex.query_at]:  # the run here read the text otherwise than the atlas's did
            say(f"the view's token {ex.query} is {shown!r}; the atlas's query was {ex.tokens[ex.query_at]!r}: "
                "the run here read the text differently")
