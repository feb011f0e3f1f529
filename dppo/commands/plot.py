"""`dppo plot`: mean return against wall-clock time and against env steps, one curve per run.

Reads each run directory's ``progress.jsonl`` (and, when present, ``config.yaml`` for the actor count
and ``summary.json`` for the target return and env id). This is the figure that shows N actors beating 1: the
same learning curve per env step, reached sooner in wall-clock time. The figure itself is :mod:`dppo.run.curves`
(the benchmarks draw it too).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dppo.run.curves import plot_runs

__all__ = ["plot_runs", "register"]

DEFAULT_OUTPUT = Path("dppo-plot.png")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `dppo plot` to the CLI."""
    parser = subparsers.add_parser(
        "plot", help="plot mean return against wall-clock time and env steps, one curve per run",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories of `dppo train`")
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT,
                        help=f"PNG file to write (default: {DEFAULT_OUTPUT})")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    plot_runs(args.run_dirs, args.output)
    print(args.output)
    return 0
