"""Errors the CLI turns into exit code 2 and one line on stderr (no traceback)."""


class UsageError(ValueError):
    """Bad input from the user: the message names what is wrong and how to fix it, on one line."""


class UnsupportedSpace(UsageError):
    """An env space dppo cannot encode: bad input, with the fix in the message."""


class RunFailure(RuntimeError):
    """The run cannot go on (crash-looping actors, a persistently failing env, NaN data or updates): exit 1,
    after a checkpoint."""
