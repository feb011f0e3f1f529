"""Memory of a process tree read from /proc (dppo/bench/memory.py), on this test's own process."""

from __future__ import annotations

import os

from dppo.bench.memory import tree_memory_mib


def test_tree_memory_counts_this_process() -> None:
    memory = tree_memory_mib([os.getpid()])
    assert memory["processes"] >= 1 and memory["rss_mib"] > 10 and memory["pss_mib"] > 0
