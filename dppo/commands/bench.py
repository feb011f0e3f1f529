"""`dppo bench`: the diagnostics of :mod:`dppo.bench`, one subcommand each (each module registers its own).

The benchmarks that reproduce the docs' figures live outside the package, in a clone's ``benchmarks/``
(``python -m benchmarks --help``)."""

from __future__ import annotations

import argparse

from dppo.bench import chaos, driver_scaling, node_loss, sampling, score, transport, update
from dppo.bench import round as round_  # the module, not the builtin

# In `dppo bench --help` order.
BENCHMARKS = (sampling, transport, update, round_, node_loss, score, driver_scaling, chaos)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `dppo bench` and its subcommands to the CLI."""
    bench = subparsers.add_parser("bench", help="diagnostics: sampling throughput, update speed, time to a score",
                                  description="measure this machine or cluster: sampling throughput, a round's "
                                  "cost, learner update speed, the driver's cost, a node lost, time to a score. "
                                  "The docs' reproductions (learning tables, peers, self-play) are a clone's "
                                  "`python -m benchmarks`.")
    sub = bench.add_subparsers(dest="bench_command", required=True, parser_class=type(bench))
    for module in BENCHMARKS:
        module.register(sub)
