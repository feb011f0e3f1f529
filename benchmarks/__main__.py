"""``python -m benchmarks NAME ...`` from a clone's root: the reproductions of the docs' figures, with the options,
exit codes and one-line errors of `dppo bench` (0 success; 2 bad input; 1 failure)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from benchmarks import env_engines, learn, learning_checks, peer, selfplay, solve, sweeps, variants
from dppo.cli_args import Parser, fail
from dppo.errors import UsageError, first_line

PROGRAM = ["python", "-m", "benchmarks"]  # the command each docs section shows
BENCHMARKS = (solve, learn, learning_checks, variants, sweeps, env_engines, selfplay, peer)  # in --help order


def build_parser() -> Parser:
    parser = Parser(prog=" ".join(PROGRAM), description="the benchmarks that reproduce the figures of README.md and "
                    "docs/benchmarks.md (dppo's own diagnostics: dppo bench --help)")
    sub = parser.add_subparsers(dest="bench_command", required=True, parser_class=Parser)
    for module in BENCHMARKS:
        module.register(sub)
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The benchmark's arguments, with the command line its docs section shows (``typed_argv``)."""
    args = build_parser().parse_args(argv)
    args.program, args.typed = PROGRAM, list(argv)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, then run the benchmark the way `dppo` runs a command (a UsageError is one line and exit 2)."""
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as err:
        fail(first_line(err))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
