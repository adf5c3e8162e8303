"""Running the CLI in-process: `cli(*argv)` gives (exit status, stdout, stderr)."""
from __future__ import annotations

from pathlib import Path

import pytest

from attn_explorer.cli.main import main


@pytest.fixture
def cli(capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse's own exits (--help, and usage errors before they became UserError)
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


def assert_one_error_line(code: int, err: str, *words: str) -> str:
    """Exit 2 and exactly one line on stderr, `error: ...`, holding each of words; no traceback."""
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]
