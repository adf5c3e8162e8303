"""The window's File → Export page as HTML…: the page (api/html.py) of what is on screen.

`page_options(state, page)` reads the view, selection and view options in the GUI thread (plain values,
at once); `html_page_job(result, path, options)` builds and writes the page in a worker (lane
"html-export", uses_model=False): a long run's maps are read through RunResult.attention, which may run
torch, and quantising every head takes longer than a frame.
"""
from __future__ import annotations

from pathlib import Path

from attn_explorer.api.html import page_html
from attn_explorer.errors import UserError
from attn_explorer.files import atomic_write, check_output

LANE = "html-export"
# the window's page -> the page's view; an analysis page opens on the view closest to it
VIEW_OF_PAGE = {"grid": "grid", "head": "head", "tokens": "tokens", "overlay": "overlay", "lines": "lines"}


def page_view(page: str | None, is_image: bool) -> str:
    """The view the exported page opens on: the window's own page where the page has it, else the grid
    (the overlay for an image run shown on the overlay page only)."""
    view = VIEW_OF_PAGE.get(page or "", "grid")
    return "grid" if view == "overlay" and not is_image else view


def page_options(state, page: str | None) -> dict:
    """What the page opens on, as the window shows it now: view, layer, head, query, hide specials, log; and
    what the window says of the loaded model (its note, untrained)."""
    r = state.result
    if r is None:
        raise UserError("nothing to export yet: no attention has been computed")
    if state.shown_stack != "encoder":
        raise UserError("the HTML page shows the encoder's maps only: the decoder and cross-attention pages "
                        "are not supported yet (switch to Encoder to export)")
    info = getattr(state, "info", None)
    refuse_signed(info)
    about = {} if info is None or info.name != r.model else dict(model_note=str(info.note or ""),
                                                                 trained=bool(info.trained))
    return dict(view=page_view(page, r.grid is not None), layer=int(state.layer), head=int(state.head),
                query=int(state.query), hide_special=bool(state.hide_special), log_scale=bool(state.log_scale),
                **about)


def refuse_signed(info) -> None:
    """The page quantises weights in 0..1 (api.html clips below 0): a hybrid's signed implicit maps would come
    out wrong, so such a model's page is refused in one line (issue 25)."""
    from attn_explorer.session.mixers import is_recurrent

    layers = [l for l in range(len(getattr(info, "mixers", ()) or ())) if is_recurrent(info, l)]
    if layers:
        raise UserError(f"{getattr(info, 'family', '') or info.name}: the HTML page draws weights from 0 to 1 and "
                        f"cannot show the signed implicit maps of its recurrent layers "
                        f"{', '.join(map(str, layers))} yet; save the run as .npz instead")


def html_page_job(result, path: str, options: dict, progress=None) -> Path:
    """Build the page of result with options and write it to path atomically (run in a worker).
    progress(fraction, message) after each head (the worker's: it stops the job once cancelled)."""
    out = check_output(Path(path))
    if out.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"a page is saved as .html; got {out.name!r}")
    page = page_html(result, **options, progress=progress)

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)

    return atomic_write(out, write)
