"""Argument parsing shared by every subcommand and benchmark: one-line errors (exit 2), number types that say
what is wrong, and the working directory on the import path."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit (2: bad input)."""
    print(f"dppo: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def existing_checkpoint(path: str) -> None:
    """A --checkpoint that names nothing is one line before the checkpoint module (and torch) is imported."""
    from pathlib import Path

    from dppo.errors import checkpoint_not_found

    if not Path(path).exists():
        fail(checkpoint_not_found(path))


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of usage + message; the line's one prefix is fail()'s, the
    command's name is in the help it points to. Options are taken only when written in full (a prefix of one is an
    error, never another option)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)")


def whole_number(text: str) -> int:
    """An integer flag that also takes 1e6 or 2.5e5, the way step budgets are written, when exact."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def positive(kind: type, name: str) -> Callable[[str], Any]:
    """A flag type: an int >= 1 or a float >= 0, with the flag's name in the error."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} {text!r} is not a number") from None
        if value < 0 or (kind is int and value < 1):
            raise argparse.ArgumentTypeError(f"{name} must be {'>= 1' if kind is int else '>= 0'}, got {text}")
        return value
    return parse


def import_from_cwd() -> None:
    """Make modules in the working directory importable, as ``python -m`` would (the console script puts its
    own bin directory first instead): a user's env module beside them works as is."""
    from dppo.envs.user_code import add_import_paths, driver_import_paths

    add_import_paths(driver_import_paths())
