"""The one error type for bad input: its message is shown to the user as one line."""


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
