"""The ``dppo`` command: the parser of every subcommand, and the process's way in and out.

Exit codes: 0 success; 2 bad input (one line on stderr, no traceback, nothing written); 1 failure.
Heavy imports (torch, ray) happen inside the commands so ``dppo --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from dppo.cli_args import Parser, fail
from dppo.commands import bench, evaluate, export, plot, status, sweep, train, tune
from dppo.errors import UsageError, first_line

SUBCOMMANDS = (train, evaluate, export, plot, bench, status, sweep, tune)  # each module has register(subparsers)
_SHOW_WARNING = warnings.showwarning


class CommandParser(Parser):
    """Every `dppo` parser, subcommands' too (``add_subparsers`` makes its parsers of its parser's class): options
    only in full. argparse's abbreviations would take ``--envs 4`` for ``--envs-per-actor 4`` and ``--envs
    CartPole-v1`` for a bad number, never for the ``--env`` meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.given: list[str] = []

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self.given = list(sys.argv[1:] if args is None else args)  # a subcommand's parser gets its own part
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """A required option missing because it was misspelt (``--check`` for ``--checkpoint``) is said as the
        misspelling, with the option meant."""
        given = self.given[:self.given.index("--")] if "--" in self.given else self.given
        known = self._option_string_actions
        unknown = [arg for arg in given if arg.startswith("--") and arg.partition("=")[0] not in known]
        if unknown and message.startswith("the following arguments are required"):
            message = unrecognized(self, unknown)
        super().error(message)


def build_parser() -> CommandParser:
    parser = CommandParser(prog="dppo",
                           description="Distributed PPO on Ray: a laptop or a KubeRay cluster, one command.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand's parser that ``args`` went through (``dppo bench round``: round's)."""
    for _ in range(8):  # subcommands nest two deep (dppo bench NAME)
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or getattr(args, sub.dest, None) not in sub.choices:
            break
        parser = sub.choices[getattr(args, sub.dest)]
    return parser


def unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """argparse's message for arguments no option takes, with the options meant when some are close or start with
    what was given (``--envs``: ``--env or --envs-per-actor``)."""
    message = f"unrecognized arguments: {' '.join(extra)}"
    given = next((arg.partition("=")[0] for arg in extra if arg.startswith("--")), None)
    if given is None:
        return message
    options = [option for action in parser._actions for option in action.option_strings
               if option.startswith("--") and option != "--help"]
    meant = difflib.get_close_matches(given, options, n=2) + [option for option in options if option.startswith(given)]
    meant = list(dict.fromkeys(meant))[:3]
    return f"{message}; did you mean {' or '.join(meant)}?" if meant else message


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; bad input: one line naming the subcommand's help, exit 2."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = chosen(parser, args)
        command.error(unrecognized(command, extra))
    return args


def show_warning(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
    """A deprecated config key or a note on the config as one line on stderr; other warnings as Python shows
    them."""
    from dppo.config import ConfigNote, DeprecatedKey
    from dppo.errors import OneLineWarning

    if issubclass(category, (DeprecatedKey, OneLineWarning)):
        print(f"dppo: warning: {message}", file=sys.stderr, flush=True)
    elif issubclass(category, ConfigNote):
        print(f"dppo: note: {message}", file=sys.stderr, flush=True)
    else:
        _SHOW_WARNING(message, category, *args, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    warnings.showwarning = show_warning
    try:
        return int(args.func(args) or 0)
    except UsageError as err:
        fail(first_line(err))
    except KeyboardInterrupt:
        return 130


def entry() -> NoReturn:
    """The `dppo` console script and `python -m dppo`: main(), then an exit without the interpreter's
    teardown of torch, Ray and their threads (about 1.8 s here). By then everything that protects data is
    done: checkpoints and summary.json written atomically, logs written and closed, TensorBoard closed,
    the actors stopped; a joined cluster is left here, a local Ray goes with this process. Crashes (a
    traceback) take the ordinary way out."""
    try:
        code = main()
    except SystemExit as stop:  # fail(): exit 2 after its one line
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        from dppo.distributed.cluster import stop_ray

        stop_ray()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
