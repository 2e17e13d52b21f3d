"""Errors that are the user's doing. The CLI prints them as one line and exits 2, never a traceback."""


class UsageError(Exception):
    """A bad argument, config value, path or input file. The message names what is wrong and where."""

    exit_code = 2


class InputError(UsageError):
    """Malformed input data; the message names the file and, where known, the line."""
