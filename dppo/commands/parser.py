"""The ``dppo`` command: the parser of every subcommand, and the process's way in and out.

Exit codes: 0 success; 2 bad input (one line on stderr, no traceback, nothing written); 1 failure.
Heavy imports (torch, ray) happen inside the commands so ``dppo --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from dppo.cli_args import Parser, fail
from dppo.commands import bench, evaluate, export, plot, status, sweep, train
from dppo.errors import UsageError, first_line

SUBCOMMANDS = (train, evaluate, export, plot, bench, status, sweep)  # each module has register(subparsers)
_SHOW_WARNING = warnings.showwarning


def build_parser() -> Parser:
    parser = Parser(prog="dppo", description="Distributed PPO on Ray: a laptop or a KubeRay cluster, one command.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def show_warning(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
    """A deprecated config key or a note on the config as one line on stderr; other warnings as Python shows
    them."""
    from dppo.config import ConfigNote, DeprecatedKey

    if issubclass(category, DeprecatedKey):
        print(f"dppo: warning: {message}", file=sys.stderr, flush=True)
    elif issubclass(category, ConfigNote):
        print(f"dppo: note: {message}", file=sys.stderr, flush=True)
    else:
        _SHOW_WARNING(message, category, *args, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
