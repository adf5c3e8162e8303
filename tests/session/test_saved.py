"""The .axsession file (session/saved.py) and the saved run's .npz read back (session/reopen.py): what is
written is read back exactly, and a damaged, foreign or newer file is refused in one line."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from attn_explorer.api.result import RunResult
from attn_explorer.errors import UserError
from attn_explorer.files import save_npz
from attn_explorer.session import saved
from attn_explorer.session.reopen import read_run, saved_run_of, tokens_text
from attn_explorer.session.saved import SavedSession, image_problem, model_problem, read_session, write_session


def _session(**kw) -> SavedSession:
    base = dict(model="minilm", dtype="bfloat16", device="cpu", text="The cat sat.", layer=2, head=5, query=3,
                query_chosen=True, dk_scale=1.7, dk_layer_only=True, max_tokens=6, page="head",
                view={"colormap": "magma", "log_scale": True, "hide_special": True, "alpha": 0.4, "stack": "encoder"})
    base.update(kw)
    return SavedSession(**base)


def test_a_session_reads_back_as_written(tmp_path):
    s = _session()
    out = write_session(s, tmp_path / "a.axsession")
    assert read_session(out) == s
    d = json.loads(out.read_text(encoding="utf-8"))
    assert d["format"] == saved.FORMAT and d["version"] == saved.VERSION and d["model"]["source"] == "minilm"


def test_writing_over_a_session_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "a.axsession"
    write_session(_session(), path)
    write_session(_session(layer=0), path)
    assert read_session(path).layer == 0
    assert [p.name for p in tmp_path.iterdir()] == ["a.axsession"]


@pytest.mark.parametrize("content,words", [
    ('{"format": "attn-explorer session", "version": 1, "model": {"sou', "damaged"),  # cut short
    (b"\xff\xfe garbage", "damaged"),
    ('{"hello": 1}', "not an attn-explorer session"),
    ('[1, 2]', "not an attn-explorer session"),
    ('{"format": "attn-explorer session", "version": "one"}', "damaged"),
])
def test_a_damaged_or_foreign_file_is_one_line(tmp_path, content, words):
    p = tmp_path / "bad.axsession"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError, match=words) as e:
        read_session(p)
    assert "\n" not in str(e.value) and "bad.axsession" in str(e.value)


@pytest.mark.parametrize("section,key,value", [
    ("selection", "layer", -1), ("selection", "head", "2"), ("sliders", "dk_scale", 0),
    ("sliders", "dk_scale", float("inf")), ("sliders", "max_tokens", 0), ("model", "dtype", "int4"),
    ("model", "source", ""), ("input", "kind", "audio"), ("selection", "query_chosen", 1),
])
def test_a_field_out_of_range_is_refused_by_name(tmp_path, section, key, value):
    d = _session().to_json()
    d[section][key] = value
    p = tmp_path / "s.axsession"
    p.write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(UserError, match=rf"damaged: {section}\.{key}"):
        read_session(p)


def test_a_newer_format_says_to_update(tmp_path):
    d = _session().to_json()
    d["version"] = saved.VERSION + 1
    p = tmp_path / "new.axsession"
    p.write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(UserError, match=f"newer attn-explorer .*format {saved.VERSION + 1}"):
        read_session(p)


def test_a_changed_image_is_one_line_and_a_missing_one_is_refused(tmp_path):
    img = tmp_path / "cat.png"
    img.write_bytes(b"first picture")
    s = _session(input_kind="image", text="", image_path=str(img), image_sha256=saved.file_sha256(img))
    assert image_problem(s) == ""
    img.write_bytes(b"another picture")
    line = image_problem(s)
    assert "cat.png changed since the session was saved" in line and "sha256" in line and "\n" not in line
    img.unlink()
    with pytest.raises(UserError, match="image .*cat.png is missing"):
        image_problem(s)


def test_a_missing_model_folder_is_refused_but_a_hub_id_is_left_to_the_loader(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    model_problem(_session(model=str(folder)))
    shutil.rmtree(folder)
    with pytest.raises(UserError, match="model .* is missing"):
        model_problem(_session(model=str(folder)))
    model_problem(_session(model="org/some-model"))  # a hub id: loading it says whether it exists


# ---------------------------------------------------------------------------------------------- saved runs
def _run(image: bool = False, seed: int = 0) -> RunResult:
    rng = np.random.default_rng(seed)
    n = 5 if image else 6
    a = rng.random((2, 3, n, n)).astype(np.float32)
    a /= a.sum(-1, keepdims=True)
    tokens = ["[CLS]"] + [f"r{i // 2}c{i % 2}" for i in range(4)] if image else ["[CLS]", "the", "cat", "##s", "sat", "[SEP]"]
    special = np.array([t in ("[CLS]", "[SEP]") for t in tokens])
    kw = dict(grid=(2, 2), image=rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), patch_offset=1) if image else {}
    return RunResult(attentions=a, tokens=tokens, special=special, model="tiny", dk_scale=1.5, forward_ms=3.0, **kw)


@pytest.mark.parametrize("image", [False, True])
def test_a_saved_run_reads_back_exactly_with_its_view(tmp_path, image):
    r = _run(image)
    view = {"page": "tokens", "layer": 1, "head": 2, "query": 3, "colormap": "magma"}
    got = read_run(save_npz(r, tmp_path / "run.npz", view=view))
    np.testing.assert_array_equal(got.result.attentions, r.attentions)
    assert got.result.tokens == r.tokens and list(got.result.special) == list(r.special)
    assert got.result.dk_scale == 1.5 and got.result.model == "tiny" and got.view == view
    assert (got.info.num_layers, got.info.num_heads, got.info.modality) == (2, 3, "image" if image else "text")
    assert "not loaded" in got.info.note and got.label == "run.npz"
    if image:
        np.testing.assert_array_equal(got.result.image, r.image)
        assert got.result.grid == (2, 2) and got.result.patch_offset == 1 and got.info.patch_size == 16


def test_an_old_run_file_without_view_or_pixels_still_opens(tmp_path):
    r = _run()
    p = tmp_path / "old.npz"
    np.savez_compressed(p, attentions=r.attentions, tokens=np.asarray(r.tokens), special=r.special,
                        model=np.asarray("tiny"), dk_scale=np.asarray(1.0))
    got = read_run(p)
    assert got.view == {} and got.result.tokens == r.tokens


def test_a_damaged_or_foreign_run_file_is_one_line(tmp_path):
    good = save_npz(_run(), tmp_path / "good.npz")
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weights=np.zeros(3))
    r = _run()
    mismatched = tmp_path / "mismatched.npz"
    np.savez(mismatched, attentions=r.attentions, tokens=np.asarray(r.tokens[:-1]), special=r.special,
             model=np.asarray("tiny"), dk_scale=np.asarray(1.0))
    nan = tmp_path / "nan.npz"
    bad = r.attentions.copy()
    bad[0, 0, 0, 0] = np.nan
    np.savez(nan, attentions=bad, tokens=np.asarray(r.tokens), special=r.special, model=np.asarray("tiny"),
             dk_scale=np.asarray(1.0))
    for path, words in ((cut, "damaged or not an .npz"), (foreign, "not a saved attn-explorer run"),
                        (mismatched, "damaged: tokens"), (nan, "damaged: attentions"),
                        (tmp_path / "none.npz", "not found")):
        with pytest.raises(UserError, match=words) as e:
            read_run(path)
        assert "\n" not in str(e.value)


def test_a_result_in_memory_keeps_its_timing_and_notes():
    r = _run()
    r.notes = ["input truncated"]
    run = saved_run_of(r)
    assert run.result.forward_ms == 3.0 and run.result.notes == ["input truncated"]
    with pytest.raises(UserError, match="RunResult or the path"):
        saved_run_of(42)


def test_tokens_text_reads_wordpieces_and_byte_level_marks():
    assert tokens_text(["[CLS]", "the", "cat", "##s", "[SEP]"], [True, False, False, False, True]) == "the cats"
    assert tokens_text(["The", "Ġcat", "s", "Ġsat"], [False] * 4) == "The cats sat"
