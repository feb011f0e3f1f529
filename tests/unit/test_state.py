"""The run's state: the count of non-finite updates in a row that ends a run."""

from __future__ import annotations

import pytest

from dppo.config import load_config
from dppo.errors import RunFailure
from dppo.run.state import RunState


def test_nonfinite_updates_in_a_row_stop_the_run() -> None:
    state = RunState(load_config(overrides={"faults.max_nonfinite_updates": 3}), vector_dim=4)
    assert state.count_update(2) == 1
    assert state.count_update(0) == 0  # a good update resets the streak
    assert state.count_update(1) == 1
    assert state.count_update(1) == 2
    with pytest.raises(RunFailure, match="3 updates in a row"):
        state.count_update(1)


def test_evaluations_keep_the_last_and_the_best_and_can_be_the_target() -> None:
    config = load_config(overrides={"run.target_return": 100.0, "run.eval_every": 2, "run.target_on": "evaluation"})
    state = RunState(config, 4)
    assert state.stop_reason() is None  # no evaluation yet
    assert state.count_evaluation(50.0) and not state.count_evaluation(40.0) and state.count_evaluation(60.0)
    assert (state.counters.eval_return_last, state.counters.eval_return_best) == (60.0, 60.0)
    state.recent_returns.extend([500.0] * 100)  # training episodes alone do not stop it
    assert state.stop_reason() is None
    state.count_evaluation(100.0)
    assert state.stop_reason() == "target_return"
    restored = RunState(config, 4)
    restored.restore(state.to_state())
    assert restored.counters.eval_return_best == 100.0  # the best survives a resume, so best.pt is not overwritten


def test_a_state_without_evaluation_counters_still_restores() -> None:
    config = load_config()
    old = RunState(config, 4).to_state()
    for key in ("eval_return_last", "eval_return_best"):  # a checkpoint written before evaluation existed
        del old["counters"][key]
    state = RunState(config, 4)
    state.restore(old)
    assert state.counters.eval_return_best is None
