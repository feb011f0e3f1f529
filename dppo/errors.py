"""The errors dppo reports to a user, and how any error becomes the one line the user reads."""

import re

_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours in Ray's messages


class UsageError(ValueError):
    """Bad input from the user: the message names what is wrong and how to fix it, on one line."""


class UnsupportedSpace(UsageError):
    """An env space dppo cannot encode: bad input, with the fix in the message."""


class OneLineWarning(UserWarning):
    """A problem the run goes on with (an env that bends its API): ``dppo: warning: ...`` on one line."""


class RunFailure(RuntimeError):
    """The run cannot go on (crash-looping actors, a persistently failing env, NaN data or updates): exit 1,
    after a checkpoint. The message is one line for the user; ``details`` (a traceback) goes to train.log."""

    def __init__(self, message: str, details: str | None = None) -> None:
        super().__init__(message)
        self.details = details


def checkpoint_not_found(path: object) -> str:
    """The line for a --checkpoint that names nothing (said before torch is imported: bad input is answered at once)."""
    return f"checkpoint {str(path)!r} not found; pass an existing ckpt-*.pt file or run dir"


def first_line(err: BaseException | str) -> str:
    """An error's first non-empty line without terminal escape codes (Ray colours its messages): what a user is
    shown; the exception's type name when it has no message."""
    text = _ESCAPES.sub("", str(err))
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line or (type(err).__name__ if isinstance(err, BaseException) else "")


class StopRun(Exception):
    """Raised by a callback (``run.callbacks``, ``dppo.train(callbacks=...)``) to end the run: it stops after this
    iteration with a final checkpoint, exit 0, and ``reason`` as summary.json's reason."""

    def __init__(self, reason: str = "callback") -> None:
        super().__init__(reason)
        self.reason = str(reason) or "callback"

