"""The one error type for bad input: its message is shown to the user as one line; and how a message
tells the user to get a missing package (pip from source or a wheel; nothing to install in a frozen app)."""
import sys


class UserError(Exception):
    """Bad input from the user (a file, a model, a value). The CLI exits 2 with its message;
    the GUI shows it without blocking and keeps the last good view."""


def first_line(text: object) -> str:
    """The first non-empty line of a message, with ANSI escapes removed and white space folded."""
    import re

    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(text))
    lines = [ln for ln in plain.splitlines() if ln.strip()]
    return " ".join(lines[0].split()) if lines else ""


def error_message(exc: BaseException) -> str:
    """One line for the user: a UserError's own message, else 'ExceptionName: message'."""
    name = type(exc).__name__
    if isinstance(exc, UserError):
        return " ".join(str(exc).split()) or name
    detail = first_line(exc)
    return f"{name}: {detail}" if detail else name


def frozen() -> bool:
    """Whether this is a frozen build (PyInstaller sets sys.frozen): pip cannot add anything to it."""
    return bool(getattr(sys, "frozen", False))


def install_advice(pip_args: str, package: str, how: str = "install it with", bundled: bool = False) -> str:
    """The end of a message about a missing package: '<how>: pip install <pip_args>' from source or a wheel.
    A frozen build cannot be pip-installed into: there, 'this build of attn-explorer does not include
    <package>', or, for a package the build is meant to carry (`bundled`), that it is missing and the
    app should be reinstalled."""
    if frozen():
        if bundled:
            return f"this build of attn-explorer is missing {package}; reinstall attn-explorer"
        return f"this build of attn-explorer does not include {package}"
    return f"{how}: pip install {pip_args}"
