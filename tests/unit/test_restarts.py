"""The restart budget: how many restarts within a sliding window end a run (on a hand-set clock, no sleeping)."""

from __future__ import annotations

import pytest

from dppo.distributed.restarts import RestartBudget
from dppo.errors import RunFailure


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def spend_at(budget: RestartBudget, clock: Clock, *times: float) -> None:
    for t in times:
        clock.now = t
        budget.spend(RuntimeError(f"at {t:g}"))


def test_one_restart_over_the_limit_inside_the_window_ends_the_run() -> None:
    clock = Clock()
    budget = RestartBudget("learner", 2, window_s=10.0, clock=clock)
    spend_at(budget, clock, 0.0, 4.0)
    clock.now = 9.0
    with pytest.raises(RunFailure, match=r"^3 learner restarts within 10s exceeds faults.max_learner_restarts=2; "
                                         r"last: three$"):
        budget.spend(RuntimeError("three"))


def test_restarts_older_than_the_window_slide_out() -> None:
    """Window 10 s, limit 2: a restart counts until it is more than 10 s old (exactly 10 s still counts)."""
    clock = Clock()
    budget = RestartBudget("actor", 2, window_s=10.0, clock=clock)
    spend_at(budget, clock, 0.0, 5.0, 10.5, 15.5)  # each third restart comes after the first of its three slid out
    assert list(budget.times) == [10.5, 15.5]
    with pytest.raises(RunFailure, match=r"^3 actor restarts within 10s"):
        spend_at(budget, clock, 20.5)  # 10.5 is exactly 10 s old: still inside


def test_the_default_clock_is_monotonic() -> None:
    import time

    assert RestartBudget("actor", 1, 1.0).clock is time.monotonic
