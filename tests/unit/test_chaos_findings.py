"""What `dppo bench chaos` broke in the driver's handling of a lost inference service, reproduced in-process."""

from __future__ import annotations

import pytest
from test_inference import FakeService, FakeServiceCalls, broadcast, driver_side

from dppo.errors import RunFailure


def dead_first(calls: FakeServiceCalls, dead: int = 1) -> None:
    """The first ``dead`` services started die before they answer anything (killed, or their node went away)."""
    start = calls.start

    def start_dying(index: int, seed: int) -> FakeService:
        service = start(index, seed)
        service.dead = len(calls.started) <= dead
        return service

    calls.start = start_dying  # type: ignore[method-assign]


def test_a_service_killed_before_it_was_ready_is_replaced_not_taken_for_a_failed_start() -> None:
    calls = FakeServiceCalls()
    dead_first(calls)
    inference, said = driver_side(calls)
    inference.start()  # ended the run: "the inference service failed to start"
    assert len(calls.started) == 2 and inference.losses == 1 and inference.handle is calls.started[1]
    assert "the inference service was lost" in said[0]


def test_a_replacement_killed_before_it_was_ready_is_replaced_again_holding_the_versions() -> None:
    calls = FakeServiceCalls()
    inference, _ = driver_side(calls)
    inference.start()
    served = inference.serve(broadcast(1))
    calls.started[0].dead = True
    dead_first(calls, dead=2)  # the replacement dies too before it is ready
    again = inference.recover(served, RuntimeError("gone"))
    assert len(calls.started) == 3 and inference.losses == 2 and again.service is calls.started[2]
    assert [version for version, _ in calls.started[2].loaded] == [1]


def test_a_service_that_never_gets_ready_still_ends_the_run_within_the_budget() -> None:
    calls = FakeServiceCalls()
    dead_first(calls, dead=100)
    inference, _ = driver_side(calls, max_restarts=2)
    with pytest.raises(RunFailure, match=r"faults\.max_actor_restarts=2"):
        inference.start()
