"""Usage mistakes (unknown option, missing argument, bad choice) are one `error:` line and exit 2,
for the window's options and for every subcommand, and nothing is written."""
from __future__ import annotations

import pytest

from attn_explorer.cli.main import SUBCOMMANDS
from tests.cli.conftest import assert_one_error_line, files_under

USAGE_MISTAKES = [
    (["--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["--model"], "--model"),  # the option needs a value
    (["export", "--text", "hi"], "--out"),  # a required option is missing
    (["export", "--out", "x.npz"], "--text"),  # one of --text, --text-file, --image is required
    (["export", "--text", "a", "--text-file", "b.txt", "--out", "x.npz"], "not allowed with"),
    (["export", "--text", "a", "--out", "x.npz", "--bogus"], "--bogus"),
    (["cost", "--bogus"], "--bogus"),
    (["nosuchcommand"], "nosuchcommand"),
]


@pytest.mark.parametrize("argv,words", USAGE_MISTAKES)
def test_usage_mistake_is_one_error_line(tmp_path, monkeypatch, cli, argv, words):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(*argv)
    line = assert_one_error_line(code, err, words)
    assert "usage:" not in err and out == ""
    assert "--help" in line  # says where the full usage is
    assert files_under(tmp_path) == set()


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_each_subcommand_names_itself_in_its_usage_hint(cli, command):
    code, _, err = cli(command, "--definitely-not-an-option")
    assert_one_error_line(code, err, f"attn-explorer {command} --help")


def test_help_still_prints_the_full_usage(cli):
    code, out, _ = cli("--help")
    assert code == 0 and "usage: attn-explorer" in out and "export" in out and "cost" in out
