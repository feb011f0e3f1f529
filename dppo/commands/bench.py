"""`dppo bench`: the benchmarks of :mod:`dppo.bench`, one subcommand each."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from dppo.bench.suite import register as register_bench

    register_bench(sub)
