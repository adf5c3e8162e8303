"""The overlay page on a vision-language run (issue 26 B): a token's attention to the image tokens drawn back on
the picture, per head, the layer's heads averaged, or every layer and head averaged; the small overlays are each
head of the layer. The numbers come from the session's worker (session.vlm.vlm_overlay_job: NumPy only here).
A text token is chosen in the page's token list, in any other page (the query is shared), or by clicking a
patch of the large picture (then that image token asks)."""
from __future__ import annotations

import math
from html import escape

import numpy as np
from PySide6.QtCore import QRectF, QTimer
from PySide6.QtWidgets import QComboBox

from attn_explorer.gui.widgets.heatmap import colormap, set_bar_label
from attn_explorer.gui.widgets.overlay import THUMB, blend, heat_label, heat_levels, thumbnail
from attn_explorer.session.long_view import result_tag
from attn_explorer.session.vlm import AVERAGES, VLM_LANE, is_vlm, vlm_overlay_job

__all__ = ["is_vlm", "average_box", "draw_vlm", "fill_tokens", "image_token_at", "patch_grid", "watch_input"]


def average_box() -> QComboBox:
    """The per-head / per-layer / averaged choice (shown only on a vision-language run)."""
    box = QComboBox()
    for key, words in AVERAGES.items():
        box.addItem(words, key)
    box.setToolTip("Which attention is drawn on the picture: the selected head, the selected layer's heads "
                   "averaged, or every layer and head averaged")
    return box


def fill_tokens(box: QComboBox, r, query: int) -> None:
    """The token list: every token that is not an image token, the query selected."""
    img = set(r.image_token_positions[:, 0].tolist())
    box.blockSignals(True)
    if box.property("tag") != result_tag(r):
        box.clear()
        for i, t in enumerate(r.tokens):
            if i not in img:
                box.addItem(f"{i}: {t!r}", i)
        box.setProperty("tag", result_tag(r))
    at = box.findData(int(query))
    box.setCurrentIndex(at)  # -1 (nothing shown) when an image token asks
    box.blockSignals(False)


def patch_grid(r) -> tuple[int, int]:
    """The first view's patch grid (rows, cols) with the merges undone, from the image tokens' places."""
    pos = r.image_token_positions
    placed = pos[(pos[:, 2] >= 0) & (pos[:, 1] == 0)]
    m = int(pos[0, 4]) or 1
    return (int(placed[:, 2].max()) + 1) * m, (int(placed[:, 3].max()) + 1) * m


def image_token_at(r, row: int, col: int) -> int | None:
    """The image token whose patch covers (row, col) of the first view (merges undone), or None."""
    pos = r.image_token_positions
    if r.image_tiles is not None:
        return None  # tiles: the large picture is assembled from several views
    m = int(pos[0, 4]) or 1
    hit = np.flatnonzero((pos[:, 1] == 0) & (pos[:, 2] == row // m) & (pos[:, 3] == col // m))
    return int(pos[hit[0], 0]) if hit.size else None


def watch_input(view) -> None:
    """A new picture or prompt: the overlay and caption of the old run go at once (they no longer match the
    input on screen) until the new run is drawn; if it fails, the old run comes back, said to be the old one."""
    view._moved = None  # (what changed, the run shown then, the error since or "")
    view._old_note = None  # (run, words): the run drawn is the one before an input that failed

    def moved(what: str) -> None:
        r = view.state.result
        if what in ("text", "image") and is_vlm(r) and view.vlm_bar.isVisible():
            view._moved = ("prompt" if what == "text" else "picture", result_tag(r), "")
            view._vlm = view.big_rgb = None
            view.big_img.clear()
            view.small_img.clear()
            view.query_box.setData([], [])
            view.caption.setText(f"The {view._moved[0]} changed: running the picture and the prompt again…")
            QTimer.singleShot(0, lambda: settled(view.state.busy))  # no run started (the same input): draw again

    def failed(message: str) -> None:
        if view._moved is not None and not view._moved[2]:
            view._moved = (*view._moved[:2], message)

    def settled(busy: bool) -> None:
        if not busy and view._moved is not None:
            view.refresh()  # the new run was drawn already, or none came: draw what is on screen, said as such

    view.state.inputs.input_changed.connect(moved)
    view.state.error_raised.connect(failed)
    view.state.busy_changed.connect(settled)


def draw_vlm(view, r) -> None:
    """Draw (or ask the worker for) the query's overlay on the picture; `view` is the PatchOverlayView."""
    st = view.state
    tag = result_tag(r)
    moved = getattr(view, "_moved", None)
    if moved is not None:
        if moved[1] == tag and st.busy:
            return  # the old run, while the new one is on its way: the caption says so
        view._moved = None
        if moved[1] == tag and moved[2]:  # the new input failed: the old run is what there is
            view._old_note = (tag, f"<b>The run before the change</b> (the new {moved[0]} did not run: "
                                   f"{escape(moved[2], quote=False)}). ")
    q = min(st.query, r.num_tokens - 1)
    avg = view.average.currentData() or "head"
    fill_tokens(view.token_pick, r, q)
    want = (result_tag(r), q, st.layer, st.head, avg)
    got = view._vlm
    if got is None or (got.tag, got.query, got.layer, got.head, got.average) != want:
        _ask(view, r, want)
        return
    view.stack.setCurrentIndex(1)
    view.alpha_label.setText(f"overlay opacity {st.alpha:.2f}")
    smooth, log = view.smooth.isChecked(), st.log_scale
    view.big_rgb = blend(r.image, got.picture, st.alpha, st.colormap, smooth, log)
    view.colorbar.setColorMap(colormap(st.colormap))
    view.colorbar.setLevels(values=heat_levels(got.picture, log)[1])
    set_bar_label(view.colorbar, heat_label("weight", log))
    ih, iw = r.image.shape[:2]
    view.big_img.setImage(view.big_rgb, levels=(0, 255), autoLevels=False)
    view.big_img.setRect(QRectF(0, 0, iw, ih))
    view.big.setRange(xRange=(0, iw), yRange=(0, ih), padding=0.02)
    view.big.setTitle({"head": f"layer {st.layer}, head {st.head}", "layer": f"layer {st.layer}, heads averaged",
                       "all": "every layer and head averaged"}[avg])
    rows, cols = got.picture.shape
    view.query_box.setData([], [])
    place = r.image_token_positions[r.image_token_positions[:, 0] == q]
    if len(place) and r.image_tiles is None and place[0, 2] >= 0:  # an image token asks: box its patch
        m = int(place[0, 4]) or 1
        y0, x0 = place[0, 2] * m * ih / rows, place[0, 3] * m * iw / cols
        y1, x1 = y0 + m * ih / rows, x0 + m * iw / cols
        view.query_box.setData([x0, x1, x1, x0, x0], [y0, y0, y1, y1, y0])
    thumb = thumbnail(r.image)
    H = len(got.heads)
    cols_m = view._cols = max(1, math.ceil(math.sqrt(H)))
    rows_m, gap = math.ceil(H / cols_m), 4
    side = THUMB + gap
    mosaic = np.full((rows_m * side - gap, cols_m * side - gap, 3), 255, np.uint8)
    for h in range(H):
        y, x = divmod(h, cols_m)
        mosaic[y * side: y * side + THUMB, x * side: x * side + THUMB] = blend(thumb, got.heads[h], st.alpha,
                                                                               st.colormap, smooth, log)
    view.small_img.setImage(mosaic, levels=(0, 255), autoLevels=False)
    view.small.setRange(xRange=(0, mosaic.shape[1]), yRange=(0, mosaic.shape[0]), padding=0.02)
    view.small.setTitle(f"layer {st.layer}: every head (click one)")
    sy, sx = divmod(st.head, cols_m)
    x0, y0 = sx * side, sy * side
    view.sel_box.setData([x0, x0 + THUMB, x0 + THUMB, x0, x0], [y0, y0, y0 + THUMB, y0 + THUMB, y0])
    view._place_labels(H, cols_m, side)
    old = getattr(view, "_old_note", None)
    view.caption.setText((old[1] if old is not None and old[0] == tag else "") + _caption(st, r, got, q))


def _caption(st, r, got, q: int) -> str:
    n_img = len(r.image_token_positions)
    where = ""
    if got.global_weight:
        where += f" ({got.global_weight:.3f} of it on the global view, not drawn: the tiles are)"
    if got.cls:
        where += f" ({got.cls:.3f} on the tower's class token, which has no place)"
    info = st.info
    tag = ""
    if info is not None and not info.trained:
        tag = " <b>Untrained model (random weights): patterns mean nothing.</b>"
    elif info is not None and info.weights.startswith("from "):  # a folder or hub id: where, not "trained"
        tag = (f" Weights {escape(info.weights, quote=False)}: the app cannot tell whether they were trained; "
               "the tiny test models hold <b>random weights</b> (patterns mean nothing).")
    if info is not None and info.note:
        tag += f"<br><i>{escape(info.note, quote=False)}</i>"
    return (f"Token <b>{q} {escape(repr(r.tokens[q]), quote=False)}</b>: {got.total:.3f} of its attention is on "
            f"the {n_img:,} image tokens{where} ({AVERAGES[got.average]}). Pick a token in the list or on another "
            "page, or click a patch (that image token asks)." + tag)


def _ask(view, r, want) -> None:
    """Ask the worker for the overlay; until it comes, the old token's heat is not left on screen."""
    view._vlm = None
    view.big_rgb = None
    view.big_img.clear()
    view.small_img.clear()
    view.query_box.setData([], [])
    view.caption.setText(f"Computing token {want[1]}'s attention to the picture…")

    def arrived(got) -> None:
        now = view.state.result
        if now is not None and is_vlm(now):
            st = view.state
            if (result_tag(now), min(st.query, now.num_tokens - 1), st.layer, st.head,
                    view.average.currentData() or "head") == want:
                view._vlm = got
                view.refresh()

    view.state.submit(vlm_overlay_job, r, want[1], want[2], want[3], want[4], key=VLM_LANE, uses_model=False,
                      on_result=arrived)
