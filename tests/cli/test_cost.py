"""`attn-explorer cost` through the real dispatcher: table, JSON, slopes, and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attn_explorer.cli.main import main
from attn_explorer.cost import cli as cost_cli
from attn_explorer.errors import UserError

SMALL = ["--heads", "2", "--dk", "64", "--repeats", "1", "--block", "16", "--window", "16"]


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """One small sweep through the CLI: (exit code, stdout, stderr, parsed JSON)."""
    out = tmp_path_factory.mktemp("cost") / "cost.json"
    capture = pytest.MonkeyPatch()
    import io

    stdout, stderr = io.StringIO(), io.StringIO()
    capture.setattr(sys, "stdout", stdout)
    capture.setattr(sys, "stderr", stderr)
    try:
        code = main(["cost", "--n", "64,128,...,512", "--impl", "naive,chunked,window,linear,sdpa",
                     *SMALL, "--json", str(out)])
    finally:
        capture.undo()
    return code, stdout.getvalue(), stderr.getvalue(), json.loads(out.read_text()), out


def test_table_has_a_row_per_point_and_the_slopes(sweep_run):
    code, stdout, _, _, _ = sweep_run
    assert code == 0
    lines = stdout.splitlines()
    assert lines[1].split() == ["n", "variant", "ms", "peak", "MB", "rel.", "error", "note"]
    rows = [ln.split() for ln in lines[2:22]]
    assert len(rows) == 20
    assert {(int(r[0]), r[1]) for r in rows} == {(n, v) for n in (64, 128, 256, 512)
                                                  for v in ("naive", "chunked", "window", "linear", "sdpa")}
    for r in rows:
        float(r[2]), float(r[3])  # measured time and memory
        if r[1] == "naive":
            assert r[4] == "-"
        else:
            assert float(r[4]) >= 0
    slope_lines = lines[lines.index("") + 1:]
    assert slope_lines[0].split()[:3] == ["variant", "time", "slope"]
    assert {ln.split()[0] for ln in slope_lines[1:]} == {"naive", "chunked", "window", "linear", "sdpa"}


def test_json_holds_every_record_config_and_slope(sweep_run):
    _, _, stderr, data, out = sweep_run
    assert f"wrote {out}" in stderr
    assert data["config"]["ns"] == [64, 128, 256, 512]
    assert data["config"]["heads"] == 2 and data["config"]["budget_bytes"] > 0
    assert len(data["results"]) == 20
    for r in data["results"]:
        assert r["status"] == "ok"
        assert r["ms"] > 0 and r["peak_bytes"] > 0 and len(r["ms_runs"]) == 1
    assert [p.name for p in out.parent.iterdir()] == ["cost.json"]  # no temporary file left behind


def test_memory_slopes_in_the_json(sweep_run):
    slopes = sweep_run[3]["slopes"]
    assert slopes["naive"]["memory_slope"] == pytest.approx(2.0, abs=0.05)
    for impl in ("chunked", "window", "linear"):
        assert slopes[impl]["memory_slope"] == pytest.approx(1.0, abs=0.1), impl
    for impl in slopes:  # time is too noisy here to pin down; it must at least be a number
        assert isinstance(slopes[impl]["time_slope"], float)


def test_oversized_runs_are_skipped_with_the_bytes_they_would_need(capsys):
    assert main(["cost", "--n", "4096", "--impl", "naive", "--budget-gb", "0.1", *SMALL]) == 0
    out = capsys.readouterr().out
    row = out.splitlines()[2]
    assert row.split()[:5] == ["4096", "naive", "-", "-", "-"]
    assert "skipped: would need 283 MB (budget 100 MB)" in row


@pytest.mark.parametrize("argv,message", [
    (["--n", "0"], "sequence length must be a positive integer, got '0'"),
    (["--n", "64,abc"], "sequence length must be a positive integer, got 'abc'"),
    (["--n", "64,..."], "--n with '...' needs the form"),
    (["--n", "64,96,...,512"], "whole growth ratio"),
    (["--impl", "naive,flash"], "unknown variant 'flash'"),
    (["--budget-gb", "-1"], "--budget-gb must be a positive number of gigabytes, got '-1'"),
    (["--budget-gb", "lots"], "--budget-gb must be a positive number"),
    (["--heads", "0"], "--heads must be a positive integer"),
    (["--repeats", "x"], "--repeats must be a positive integer"),
    (["--dtype", "float16"], "needs a GPU"),
    (["--json", "/no/such/folder/out.json"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["cost", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert message in lines[0]


def test_n_lists_with_an_ellipsis():
    assert cost_cli.parse_ns("256,512,...,4096") == [256, 512, 1024, 2048, 4096]
    assert cost_cli.parse_ns("100,...,500") == [100, 200, 400, 500]
    assert cost_cli.parse_ns("64, 100,3") == [64, 100, 3]
    with pytest.raises(UserError):
        cost_cli.parse_ns("...,64")


def test_block_sizes():
    assert cost_cli.parse_blocks("auto,256") == (None, 256)
    assert cost_cli.parse_blocks("auto") == (None, 256)
    assert cost_cli.parse_blocks("64") == (64, 64)
    assert cost_cli.parse_blocks("64,128") == (64, 128)
    with pytest.raises(UserError):
        cost_cli.parse_blocks("0,64")


def test_json_write_is_atomic(tmp_path, monkeypatch):
    dest = tmp_path / "out.json"
    dest.write_text('{"old": true}')

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(cost_cli.json, "dump", broken)
    with pytest.raises(OSError):
        cost_cli.write_json_atomic(dest, {"new": True})
    assert json.loads(dest.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_cli_module_does_not_import_torch():
    code = "import sys, attn_explorer.cli.cost; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
