"""`dppo bench`: the benchmarks of :mod:`dppo.bench`, one subcommand each (each module registers its own)."""

from __future__ import annotations

import argparse

from dppo.bench import (
    driver_scaling,
    env_engines,
    learn,
    node_loss,
    peer,
    sampling,
    score,
    selfplay,
    solve,
    sweeps,
    update,
    variants,
)
from dppo.bench import round as round_  # the module, not the builtin

# In `dppo bench --help` order.
BENCHMARKS = (sampling, solve, update, learn, variants, sweeps, round_, node_loss, score, driver_scaling, env_engines,
              selfplay, peer)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `dppo bench` and its subcommands to the CLI."""
    bench = subparsers.add_parser("bench", help="benchmarks: sampling throughput, time to solve, update speed",
                                  description="sampling throughput, time to solve, learner update speed and "
                                  "weight broadcast.")
    sub = bench.add_subparsers(dest="bench_command", required=True, parser_class=type(bench))
    for module in BENCHMARKS:
        module.register(sub)
