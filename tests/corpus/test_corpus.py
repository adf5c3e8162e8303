"""The hostile-input corpus through the command line and the Python API.

Every bad case: `export` exits 2 with exactly one `error: ...` line on stderr, no traceback, and
nothing new on disk; the API raises UserError with the same one line. The pictures that only look
hostile (1×1, 16-bit, CMYK, palette with alpha, animated GIF, a 4000×2 strip) must work everywhere.
The GUI side is in tests/gui/test_faults.py. Built-in models load once per module.
"""
from __future__ import annotations

import numpy as np
import pytest

import attn_explorer as ax
from attn_explorer.api import load as api_load
from attn_explorer.errors import UserError
from attn_explorer.files import read_text_file
from tests.cli.conftest import assert_one_error_line, cli, files_under  # noqa: F401 - cli is a fixture
from tests.corpus.cases import BAD, GOOD_IMAGES, TEXT, Case
from tests.corpus.make_cases import build_all

_BUILTINS: dict[str, object] = {}
_LOAD = api_load.load_model


def builtin(name: str):
    if name not in _BUILTINS:
        _BUILTINS[name] = _LOAD(name, device="cpu")
    return _BUILTINS[name]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    return build_all(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def cached_builtins(monkeypatch):
    """The CLI loads through api.load.load_model: built-ins come from this module's cache (seconds each
    otherwise); every other source is loaded for real."""
    def load(src="minilm", device="auto", dtype="float32", progress=None):
        if str(src) in ("minilm", "textbook", "textbook-vit") and device in ("cpu", "auto") and dtype == "float32":
            return builtin(str(src))
        return _LOAD(src, device=device, dtype=dtype, progress=progress)

    monkeypatch.setattr(api_load, "load_model", load)


def fill(value, corpus: dict):
    if isinstance(value, str):
        return value.format(**{k: str(v) for k, v in corpus.items()})
    if isinstance(value, dict):
        return {k: fill(v, corpus) for k, v in value.items()}
    return value


def same_words(expect: str, message: str) -> bool:
    """The CLI names options (--dk-scale), the API names arguments (dk_scale): the same words otherwise."""
    return expect.replace("_", "-") in message.replace("_", "-")


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_cli_export_says_one_line_and_writes_nothing(case: Case, corpus, cli, cached_builtins):
    args = [fill(a, corpus) for a in case.cli]
    if "--out" not in args:
        args += ["--out", str(corpus["root"] / "out" / "x.npz")]
    before = files_under(corpus["root"])
    code, out, err = cli("export", *args)
    line = assert_one_error_line(code, err)
    assert same_words(case.expect, line), line
    assert files_under(corpus["root"]) == before  # nothing written, not even a temporary file
    assert "wrote" not in out


API_CASES = [c for c in BAD if c.api is not None]


@pytest.mark.parametrize("case", API_CASES, ids=[c.id for c in API_CASES])
def test_api_raises_one_user_error_line(case: Case, corpus):
    kind, *rest = fill(case.api, corpus) if isinstance(case.api, str) else [fill(v, corpus) for v in case.api]
    with pytest.raises(UserError) as e:
        if kind == "load":
            ax.load_model(rest[0], device="cpu")
        elif kind == "text":
            builtin("minilm").run(rest[0], **rest[1])
        elif kind == "image":
            builtin("textbook-vit").run(rest[0], **rest[1])
        else:
            read_text_file(rest[0])
    message = str(e.value)
    assert message and "\n" not in message and "Traceback" not in message
    assert same_words(case.api_expect or case.expect, message), message


def test_the_corpus_is_large_and_every_case_has_its_own_name():
    assert len(BAD) >= 60
    assert len({c.id for c in BAD}) == len(BAD)


@pytest.mark.parametrize("name", GOOD_IMAGES)
def test_pictures_that_only_look_hostile_work(name, corpus, cli, cached_builtins):
    vit = builtin("textbook-vit")
    r = vit.run(str(corpus[name]))
    assert r.grid == (14, 14) and r.image.shape == (224, 224, 3) and r.image.dtype == np.uint8
    assert np.isfinite(r.attentions).all()
    out = corpus["root"] / f"{name}.npz"
    code, _, err = cli("export", "--model", "textbook-vit", "--image", corpus[name], "--out", out)
    assert code == 0 and "error" not in err, err
    np.testing.assert_array_equal(np.load(out)["attentions"], r.attentions)
    out.unlink()


def test_an_animated_gif_shows_its_first_frame(corpus):
    r = builtin("textbook-vit").run(str(corpus["animated_gif"]))
    red, green, blue = r.image.reshape(-1, 3).mean(0)
    assert red > 200 and green < 30 and blue < 30  # frames are red, green, blue: the first one is shown


def test_a_one_pixel_picture_fills_the_input_with_its_colour(corpus):
    r = builtin("textbook-vit").run(str(corpus["one_pixel"]))
    assert (np.abs(r.image.astype(int) - (200, 30, 30)) <= 1).all()


def test_a_two_megabyte_text_file_runs_as_the_same_text_typed(cli, corpus, cached_builtins):
    """2 MB from --text-file and the same 2 MB from --text: both cut to MiniLM's 512 tokens with the same
    note, and the same numbers saved (a file over 1 MB used to be refused)."""
    text = corpus["big_txt"].read_text(encoding="utf-8")
    saved, notes = [], []
    for i, source in enumerate((("--text-file", str(corpus["big_txt"])), ("--text", text))):
        out = corpus["root"] / f"long{i}.npz"
        code, _, err = cli("export", "--model", "minilm", *source, "--out", out)
        assert code == 0, err[:300]
        notes.append([ln for ln in err.splitlines() if ln.startswith("note:")])
        saved.append(dict(np.load(out)))
        out.unlink()
    assert notes[0] == notes[1] == ["note: input truncated to its first 512 tokens (the most minilm can read)"]
    assert list(saved[0]["tokens"]) == list(saved[1]["tokens"]) and len(saved[0]["tokens"]) == 512
    np.testing.assert_array_equal(saved[0]["attentions"], saved[1]["attentions"])


def test_two_megabytes_of_typed_text_is_cut_with_a_note(cli, corpus, cached_builtins):
    """Text given directly is cut to the model's positions, and the note says so."""
    r = builtin("textbook").run("word " * 400_000)
    assert len(r.tokens) == 512 and r.truncated and any("truncated" in n for n in r.notes)
    out = corpus["root"] / "long.npz"
    code, _, err = cli("export", "--model", "textbook", "--text", "word " * 400_000, "--out", out)
    assert code == 0 and "note: input truncated to its first 512 tokens" in err, err[:300]
    out.unlink()


def test_the_api_and_cli_agree_on_a_good_run(cli, corpus, cached_builtins):
    """Control for the table above: the same front ends, fed good input, do write."""
    out = corpus["root"] / "ok.npz"
    code, _, err = cli("export", "--text", TEXT, "--out", out)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(out)["attentions"], builtin("minilm").run(TEXT).attentions)
    out.unlink()
