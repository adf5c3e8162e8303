"""The one error type for bad input: its message is shown to the user as one line."""


class UserError(Exception):
    """Bad input from the user (a file, a model, a value). The CLI exits 2 with its message;
    the GUI shows it without blocking and keeps the last good view."""
