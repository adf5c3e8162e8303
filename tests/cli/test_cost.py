"""`attn-explorer cost` through the real dispatcher: table, JSON, slopes, and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attn_explorer.cli.main import main
from attn_explorer.cli import cost as cost_cli
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
    assert lines[1].startswith("# rel. error: relative error of the output vs exact, ‖out − exact‖ / ‖exact‖")
    assert lines[2].split() == ["n", "variant", "median", "ms", "min–max", "ms", "peak", "MB", "rel.", "error", "note"]
    rows = [ln.split() for ln in lines[3:23]]
    assert len(rows) == 20
    assert {(int(r[0]), r[1]) for r in rows} == {(n, v) for n in (64, 128, 256, 512)
                                                  for v in ("naive", "chunked", "window", "linear", "sdpa")}
    for r in rows:
        lo, hi = (float(x) for x in r[3].split("–"))  # the spread of the timed runs
        assert lo <= float(r[2]) <= hi and float(r[4]) > 0  # median inside it; measured memory
        if r[1] == "naive":
            assert r[5] == "-"
        else:
            assert float(r[5]) >= 0
    slope_lines = lines[lines.index("") + 1:]
    assert slope_lines[0].split()[:3] == ["variant", "time", "slope"]
    assert {ln.split()[0] for ln in slope_lines[1:6]} == {"naive", "chunked", "window", "linear", "sdpa"}
    assert "fitted over the large-n points only" in slope_lines[6]


def test_json_holds_every_record_config_and_slope(sweep_run):
    _, _, stderr, data, out = sweep_run
    assert f"wrote {out}" in stderr
    assert data["config"]["ns"] == [64, 128, 256, 512]
    assert data["config"]["heads"] == 2 and data["config"]["budget_bytes"] > 0
    assert len(data["results"]) == 20
    for r in data["results"]:
        assert r["status"] == "ok"
        assert r["ms"] > 0 and r["peak_bytes"] > 0 and len(r["ms_runs"]) == 1
        assert r["ms_min"] == r["ms_max"] == r["ms"]
    assert [p.name for p in out.parent.iterdir()] == ["cost.json"]  # no temporary file left behind


def test_memory_slopes_in_the_json(sweep_run):
    slopes = sweep_run[3]["slopes"]
    assert 1.6 < slopes["naive"]["memory_slope"] <= 2.05  # n² scores plus O(n) tensors that still show at n ≤ 512
    for impl in ("chunked", "window", "linear"):
        assert slopes[impl]["memory_slope"] == pytest.approx(1.0, abs=0.1), impl
    for impl in slopes:  # time is too noisy here to pin down: a number, or None when it never grew 4×
        assert slopes[impl]["time_slope"] is None or isinstance(slopes[impl]["time_slope"], float)


def test_oversized_runs_are_skipped_with_the_bytes_they_would_need(capsys):
    assert main(["cost", "--n", "4096", "--impl", "naive", "--budget-gb", "0.1", *SMALL]) == 0
    out = capsys.readouterr().out
    row = out.splitlines()[3]
    assert row.split()[:6] == ["4096", "naive", "-", "-", "-", "-"]
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
    with pytest.raises(UserError, match="^--json: cannot write .*: disk full$"):  # one line, not a traceback
        cost_cli.write_json_atomic(dest, {"new": True})
    assert json.loads(dest.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_cli_module_does_not_import_torch():
    code = "import sys, attn_explorer.cli.cost; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --- the noise verdict and the model's own q, k, v -----------------------------------------------


def test_noisy_timings_print_a_warning(monkeypatch, capsys):
    # every third run 3× slower: the same spread a busy machine gives, and the CLI must say so
    from attn_explorer.cost import measure

    calls = []

    def jittery(call, device):
        n = call().shape[-2]
        calls.append(n)
        return 1e-4 * n * n * (3.0 if len(calls) % 3 == 0 else 1.0)

    monkeypatch.setattr(measure, "timed_call", jittery)
    assert main(["cost", "--n", "256,512,...,2048", "--impl", "naive,linear", *SMALL]
                + ["--repeats", "3"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: These timings are noisy (")
    assert "spread" in err and len(err.splitlines()) == 1


def test_quiet_timings_print_no_warning(monkeypatch, capsys):
    from attn_explorer.cost import measure

    monkeypatch.setattr(measure, "timed_call", lambda call, device: 1e-4 * call().shape[-2] ** 2)
    assert main(["cost", "--n", "256,512,...,2048", "--impl", "naive", *SMALL, "--repeats", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "naive          2.00" in captured.out  # the scripted n² comes back as its slope


def test_real_qkv_puts_the_models_errors_next_to_random_ones(capsys, tmp_path):
    text = "The animal didn't cross the street because it was too tired. " * 4
    assert main(["cost", "--real-qkv", "--model", "minilm", "--text", text, "--layer", "0", "--window", "8",
                 "--repeats", "1", "--json", str(tmp_path / "qkv.json")]) == 0
    data = json.loads((tmp_path / "qkv.json").read_text())
    assert (data["model"], data["layer"], data["window"]) == ("minilm", 0, 8)
    assert {r["impl"] for r in data["rows"]} == {"naive", "chunked", "window", "linear", "sdpa"}
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# minilm, layer 0: 12 heads × ") and "window w = 8" in out[0]
    rows = {ln.split()[0]: ln.split() for ln in out[3:]}
    assert set(rows) == {"naive", "chunked", "window", "linear", "sdpa"}
    assert rows["naive"][1:3] == ["reference", "reference"]
    real, rand = float(rows["window"][1]), float(rows["window"][2])
    assert real < rand / 2  # a trained model's heads look nearby: the window misses far less of it
    assert float(rows["chunked"][1]) < 1e-5


@pytest.mark.parametrize("argv,message", [
    (["--layer", "99"], "layer 99 does not exist"),
    (["--layer", "x"], "--layer must be a layer number"),
    (["--text", "  "], "--text is empty"),
])
def test_real_qkv_bad_input_is_one_line(argv, message, capsys):
    assert main(["cost", "--real-qkv", "--model", "minilm", *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
