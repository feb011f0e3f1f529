"""The restart budget: how many restarts within a sliding window end a run."""

from __future__ import annotations

import pytest


def test_restart_budget_slides_its_window() -> None:
    """Restarts older than the window no longer count; one over the limit inside it ends the run."""
    import time

    from dppo.distributed.restarts import RestartBudget
    from dppo.errors import RunFailure

    budget = RestartBudget("learner", 2, window_s=0.3)
    budget.spend(RuntimeError("one"))
    budget.spend(RuntimeError("two"))
    with pytest.raises(RunFailure, match=r"3 learner restarts within 0.3s exceeds faults.max_learner_restarts=2; "
                                         r"last: three"):
        budget.spend(RuntimeError("three"))
    time.sleep(0.35)
    budget.spend(RuntimeError("after the window"))  # the three above slid out
