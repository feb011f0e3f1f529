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
