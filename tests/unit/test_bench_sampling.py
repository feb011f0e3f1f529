"""The sampling benchmark's latency-bound ceiling (dppo/bench/sampling.py); its rows are timed in
tests/integration/test_bench.py."""

from __future__ import annotations

from dppo.bench.sampling import sampling_limit


def test_sampling_limit() -> None:
    assert sampling_limit(8, 8, 0.0, "sync") is None
    assert sampling_limit(8, 8, 2.0, "sync") == 4000.0  # envs stepped one after another
    assert sampling_limit(1, 8, 2.0, "async") == 4000.0  # all envs of an actor wait at once
    assert sampling_limit(0, 8, 2.0, "sync") == 500.0  # the in-process row counts as one
