"""Your own analyses: `ax.register_analysis(name, fn, view=None)`, the checks on every answer, and the
`attn_explorer.analyses` entry point group read in a new process (as the window and the CLI read it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attn_explorer as ax
from attn_explorer.api import analyses as reg
from attn_explorer.errors import UserError
from tests.api.test_html import fake_run
from tests.analysis_registry import prev_token, registry_kept

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_registry():
    with registry_kept():
        yield


def test_register_run_and_list():
    r = fake_run(L=2, H=3, N=7)
    assert ax.register_analysis("prev_token", prev_token) is prev_token
    assert "prev_token" in ax.analyses()
    a = reg.run_analysis("prev_token", r)
    assert a.view == "grid" and a.values.shape == (2, 3)
    assert np.allclose(a.values, prev_token(r))
    assert a.rows == ["0", "1"] and a.cols == ["0", "1", "2"]


def test_views_are_inferred_from_the_shape_and_labelled():
    r = fake_run(L=2, H=3, N=7)
    ax.register_analysis("last_row", lambda r: r.attentions[-1].mean(0)[-1])
    ax.register_analysis("mean_map", lambda r: r.attentions.mean((0, 1)))
    t = reg.run_analysis("last_row", r)
    assert t.view == "tokens" and t.cols == r.tokens
    m = reg.run_analysis("mean_map", r)
    assert m.view == "map" and m.rows == m.cols == r.tokens


def test_an_image_map_is_the_patch_grid():
    r = fake_run(L=3, H=4, image=True)  # a 2 × 3 patch grid after [CLS]
    ax.register_analysis("cls_on_patches", lambda r: r.attentions[-1, 0, 0, 1:].reshape(r.grid))
    a = reg.run_analysis("cls_on_patches", r)
    assert a.view == "map" and a.values.shape == (2, 3)
    assert a.rows == ["r0", "r1"] and a.cols == ["c0", "c1", "c2"]


def test_a_shape_that_fits_two_views_is_a_grid_unless_told():
    r = fake_run(L=2, H=3, image=True)  # (L, H) == the patch grid (2, 3)
    ax.register_analysis("cls", lambda r: r.attentions[-1, 0, 0, 1:].reshape(r.grid))
    assert reg.run_analysis("cls", r).view == "grid"
    ax.register_analysis("cls", lambda r: r.attentions[-1, 0, 0, 1:].reshape(r.grid), view="map")
    assert reg.run_analysis("cls", r).view == "map"


def test_registering_again_replaces():
    r = fake_run(L=2, H=3)
    ax.register_analysis("x", lambda r: np.zeros((2, 3)))
    ax.register_analysis("x", lambda r: np.ones(len(r.tokens)), view="tokens")
    assert ax.analyses().count("x") == 1
    assert reg.run_analysis("x", r).view == "tokens"
    ax.unregister_analysis("x")
    assert "x" not in ax.analyses()


@pytest.mark.parametrize("name, fn, view, words", [
    ("", prev_token, None, "needs a name"),
    ("   ", prev_token, None, "needs a name"),
    (None, prev_token, None, "needs a name"),
    (3, prev_token, None, "needs a name"),
    ("prev token", prev_token, None, "must start with a letter"),
    ("1st", prev_token, None, "must start with a letter"),
    ("a/b", prev_token, None, "must start with a letter"),
    ("x" * 65, prev_token, None, "at most 64"),
    ("rollout", prev_token, None, "taken by a built-in"),
    ("Stats", prev_token, None, "taken by a built-in"),
    ("ok", None, None, "fn must be a function"),
    ("ok", np.zeros(3), None, "fn must be a function"),
    ("ok", prev_token, "heatmap", "view must be None"),
    ("ok", prev_token, "Grid", "view must be None"),
])
def test_register_refuses_bad_input_in_one_line(name, fn, view, words):
    with pytest.raises(UserError, match=words) as e:
        ax.register_analysis(name, fn, view)
    assert "\n" not in str(e.value)
    assert "ok" not in ax.analyses()


@pytest.mark.parametrize("fn, view, words", [
    (lambda r: 1 / 0, None, "failed: ZeroDivisionError"),
    (lambda r: r.no_such_field, None, "failed: AttributeError"),
    (lambda r: None, None, "array of object"),
    (lambda r: "text", None, "array of <U4"),
    (lambda r: np.zeros(3, complex), None, "array of complex128"),
    (lambda r: 0.5, None, "shape ()"),
    (lambda r: np.zeros((2, 3, 1)), None, "shape (2, 3, 1)"),
    (lambda r: np.zeros(6), None, "shape (6,)"),
    (lambda r: np.zeros(7), "grid", "for view 'grid'"),
    (lambda r: np.zeros((2, 3)), "tokens", "needs (7,)"),
    (lambda r: np.zeros((2, 3)), "map", "needs (7, 7)"),
    (lambda r: np.full((2, 3), np.nan), None, "6 value(s) that are NaN"),
    (lambda r: np.array([[0, np.inf, 0], [0, 0, 0]]), None, "1 value(s) that are NaN or infinite"),
    (lambda r: [[1, 2, 3], [4, 5]], None, "not an array"),
])
def test_a_bad_answer_is_one_line_naming_the_analysis(fn, view, words):
    ax.register_analysis("mine", fn, view)
    with pytest.raises(UserError) as e:
        reg.run_analysis("mine", fake_run(L=2, H=3, N=7))
    msg = str(e.value)
    assert "\n" not in msg and "'mine'" in msg and words in msg, msg


def test_a_user_error_inside_fn_keeps_its_own_words():
    def lazy_reader(r):
        raise UserError("this run kept no attention maps: read a head with r.attention(...)")

    ax.register_analysis("lazy", lazy_reader)
    with pytest.raises(UserError, match=r"^analysis 'lazy' failed: this run kept no attention maps"):
        reg.run_analysis("lazy", fake_run())


def test_an_unknown_name_lists_the_known_ones():
    ax.register_analysis("prev_token", prev_token)
    with pytest.raises(UserError, match=r"unknown analysis 'nope' \(registered: .*prev_token"):
        reg.run_analysis("nope", fake_run())


def test_integer_and_bool_answers_are_numbers():
    ax.register_analysis("top_is_prev", lambda r: r.attentions.argmax(-1)[:, :, -1] == len(r.tokens) - 2)
    assert reg.run_analysis("top_is_prev", fake_run(L=2, H=3)).values.dtype == bool


# ---- installed packages: entry points, read in a new process --------------------------------------------

PACKAGE = '''
import numpy as np

def prev_token(r):
    n = r.attentions.shape[-1]
    i = np.arange(1, n)
    return r.attentions[:, :, i, i - 1].mean(-1)

def first_column(r):
    return r.attentions.mean((0, 1))[:, 0]

AS_TUPLE = (first_column, "tokens")
AS_DICT = {"fn": prev_token, "view": "grid"}
NOT_CALLABLE = 42
'''

ENTRY_POINTS = '''
[attn_explorer.analyses]
prev_token = axmine:prev_token
first_col = axmine:AS_TUPLE
prev_dict = axmine:AS_DICT
broken = axmine_missing:fn
not_fn = axmine:NOT_CALLABLE
'''


def write_package(folder: Path) -> Path:
    """A tiny installed distribution: axmine.py and its .dist-info with METADATA and entry_points.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "axmine.py").write_text(PACKAGE, encoding="utf-8")
    info = folder / "axmine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: axmine\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(ENTRY_POINTS, encoding="utf-8")
    return folder


def new_process(code: str, path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=os.pathsep.join([str(path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


SCRIPT = r'''
import sys
import attn_explorer as ax
from attn_explorer.api.analyses import problems, run_analysis, catalogue
from tests.api.test_html import fake_run
print("torch-before", "torch" in sys.modules)
print("names", sorted(ax.analyses()))
print("views", sorted((n, v or "-") for n, v in catalogue()))
for p in problems():
    print("problem", p)
r = fake_run(L=2, H=3, N=7)
for n in ("prev_token", "first_col", "prev_dict"):
    a = run_analysis(n, r)
    print("ran", n, a.view, a.values.shape)
from attn_explorer.session.custom import custom_analysis_job  # what the window's page runs in its worker
rep = custom_analysis_job("first_col", r)
print("window", [n for n, _ in rep.names], rep.answer.view, len(rep.problems), repr(rep.error))
ax.register_analysis("prev_token", lambda r: r.attentions.mean((0, 1)), view="map")  # replaces the installed one
print("replaced", run_analysis("prev_token", r).view)
'''


def test_entry_points_are_found_in_a_new_process(tmp_path):
    proc = new_process(SCRIPT, write_package(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "torch-before False" in lines
    assert "names ['first_col', 'prev_dict', 'prev_token']" in lines, lines
    assert "views [('first_col', 'tokens'), ('prev_dict', 'grid'), ('prev_token', '-')]" in lines, lines
    assert "ran prev_token grid (2, 3)" in lines and "ran first_col tokens (7,)" in lines
    assert "ran prev_dict grid (2, 3)" in lines and "replaced map" in lines
    assert "window ['prev_token', 'first_col', 'prev_dict'] tokens 2 ''" in lines, lines
    problems = [ln for ln in lines if ln.startswith("problem ")]
    assert len(problems) == 2, lines
    assert any("'broken' from axmine" in p and "ModuleNotFoundError" in p for p in problems), problems
    assert any("'not_fn' from axmine" in p and "fn must be a function" in p for p in problems), problems


CLI_SCRIPT = r'''
import sys
from attn_explorer.cli.main import main
sys.exit(main(["export", "--model", "textbook", "--text", "the cat sat on the mat", "--analysis",
               "prev_token,broken", "--out", sys.argv[1]]))
'''


def test_the_cli_of_a_new_process_exports_an_installed_analysis(tmp_path):
    pkg = write_package(tmp_path / "site")
    out = tmp_path / "out.npz"
    proc = new_process(CLI_SCRIPT.replace("prev_token,broken", "prev_token"), pkg, str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as z:
        grid = z["analysis_prev_token"]
        att = z["attentions"]
    i = np.arange(1, att.shape[-1])
    assert grid.shape == att.shape[:2] and np.allclose(grid, att[:, :, i, i - 1].mean(-1))
    assert "could not be loaded" in proc.stderr  # the broken entry points are said, as notes
    out.unlink()
    proc = new_process(CLI_SCRIPT, pkg, str(out))  # asking for the broken one: its own line, exit 2
    assert proc.returncode == 2 and not out.exists()
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith("error: analysis 'broken' from axmine") and "Traceback" not in proc.stderr, err
