"""Errors the CLI turns into exit code 2 and one line on stderr (no traceback)."""


class UsageError(ValueError):
    """Bad input from the user: the message names what is wrong and how to fix it, on one line."""
