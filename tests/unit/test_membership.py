"""Elastic membership on fake Ray calls and fake time: the start (all ready, short, past the timeout for the
floor), the lines that tell an actor the cluster has no room for from one still making its envs, losses told
apart and replaced, the floor wait and a stop during it."""

from __future__ import annotations

import math

import pytest
import ray
from fake_ray import Events, FakeRayCalls, Script, crash, preempted

from dppo.config import load_config
from dppo.distributed.membership import Membership, Stop
from dppo.envs.user_code import EnvLoadError
from dppo.errors import RunFailure

NEVER = math.inf


def membership(script, actors: int = 4, should_stop=lambda: False, **faults) -> tuple[Membership, FakeRayCalls,
                                                                                         Events]:
    config = load_config(overrides={"run.actors": actors, **{f"faults.{k}": v for k, v in faults.items()}})
    calls, events = FakeRayCalls(script), Events()
    return Membership(config, events, should_stop, calls), calls, events


def waiting_lines(events: Events) -> list[str]:
    return [m for m in events.messages if m.startswith("waiting for actors")]


def test_start_waits_for_every_actor_and_says_nothing_when_all_came() -> None:
    members, calls, events = membership(lambda i, n: Script(placed_s=i, start_s=2.0))
    members.start()
    assert members.alive == [0, 1, 2, 3] and members.pending == []
    assert calls.time == 5.0  # the last one placed at 3 s, envs made 2 s later: no longer
    assert events.messages == [] and events.counts[-1] == (4, 0)


def test_a_short_start_is_one_line_telling_no_room_from_still_starting() -> None:
    """Two ready, one placed but slow to make its envs, one the cluster has no room for: after the start timeout
    the run starts with the two and says why the others are missing; the waiting lines said it too."""
    scripts = {0: Script(start_s=5), 1: Script(start_s=5), 2: Script(start_s=200), 3: Script(placed_s=NEVER)}
    members, calls, events = membership(lambda i, n: scripts[i], min_actors=2, actor_start_timeout_s=60)
    members.start()
    assert members.alive == [0, 1] and members.pending == [2, 3] and calls.time == 60.0
    starts = [m for m in events.messages if m.startswith("training starts")]
    assert starts == ["training starts with 2 of 4 actors after 60 s (faults.actor_start_timeout_s=60, "
                      "faults.min_actors=2): 1 not placed yet (the cluster has no room for it); 1 placed, still "
                      "starting (making its envs); they join when ready"]
    waiting = waiting_lines(events)
    assert len(waiting) == 5  # every 10 s until the timeout at 60 s
    assert waiting[0] == ("waiting for actors to be placed and start: 2 of 4 alive (faults.min_actors=2); 1 not "
                          "placed yet (the cluster has no room for it); 1 placed, still starting (making its envs)")


def test_actors_only_slow_to_start_are_never_said_to_lack_room() -> None:
    """16 actors on a machine with room for all of them, each taking 45 s to make its envs."""
    members, calls, events = membership(lambda i, n: Script(start_s=45), actors=16)
    members.start()
    assert members.alive == list(range(16)) and calls.time == 45.0
    assert waiting_lines(events) == ["waiting for actors to be placed and start: 0 of 16 alive "
                                     "(faults.min_actors=1); 16 placed, still starting (making their envs)"] * 4
    assert not any("no room" in m for m in events.messages)


def test_the_start_waits_past_its_timeout_until_the_floor_is_alive() -> None:
    scripts = {0: Script(start_s=1), 1: Script(start_s=1), 2: Script(placed_s=99, start_s=1),
               3: Script(placed_s=NEVER)}
    members, calls, events = membership(lambda i, n: scripts[i], min_actors=3, actor_start_timeout_s=30)
    members.start()
    assert members.alive == [0, 1, 2] and calls.time == 100.0
    assert events.messages[-1] == ("training starts with 3 of 4 actors after 100 s (faults.actor_start_timeout_s=30, "
                                   "faults.min_actors=3): 1 not placed yet (the cluster has no room for it); it "
                                   "joins when ready")


def test_an_env_an_actor_cannot_make_is_bad_input_and_every_actor_is_stopped() -> None:
    members, calls, _ = membership(lambda i, n: Script(problem="env 'Nope-v0' not found" if i == 2 else None))
    with pytest.raises(EnvLoadError, match="Nope-v0"):
        members.start()
    assert all(actor.killed for actor in calls.actors) and members.slots == []


def test_an_actor_whose_constructor_raised_ends_the_run() -> None:
    init_failed = ray.exceptions.RayActorError(error_msg="ImportError: no module", actor_init_failed=True)
    members, calls, _ = membership(lambda i, n: Script(ready_error=init_failed if i == 1 else None))
    with pytest.raises(RunFailure, match="actor 1 failed to start: ImportError: no module"):
        members.start()
    assert all(actor.killed for actor in calls.actors)


def test_an_actor_lost_before_it_was_ready_is_replaced_with_a_fresh_seed() -> None:
    members, calls, events = membership(
        lambda i, n: Script(start_s=3, ready_error=preempted(i) if (i, n) == (1, 0) else None), actors=2)
    members.start()
    assert members.alive == [0, 1] and events.losses == [(1, "node", "node-a")]
    first, replacement = [a for a in calls.actors if a.index == 1]
    assert first.killed and not replacement.killed and first.seed != replacement.seed
    assert "actor 1 back after 3.0 s: 2 of 2 actors alive" in events.messages


@pytest.mark.parametrize(("error", "node_dead", "cause"), [
    (crash(0), False, "crash"),  # the process died, its node lives: a broken env
    (crash(0), True, "node"),  # the node is gone from ray.nodes(): it went with its node
    (preempted(0), False, "node"),
    (ray.exceptions.ActorUnavailableError("unreachable", None), False, "node"),  # its raylet no longer answers
])
def test_losses_are_told_apart_and_only_crashes_spend_the_budget(error: Exception, node_dead: bool,
                                                                 cause: str) -> None:
    members, calls, events = membership(lambda i, n: Script(), actors=2)
    members.start()
    if node_dead:
        calls.node_deaths.append((calls.time, "node-a"))
    members.replace(0, error)
    assert events.losses == [(0, cause, "node-a")]
    assert len(members.crashes.times) == (cause == "crash")
    assert members.pending == [0] and events.counts[-1] == (1, 1)
    what = "crashed" if cause == "crash" else "lost with its node"
    assert events.messages[-1].startswith(f"actor 0 {what} ({type(error).__name__}: ")
    assert events.messages[-1].endswith("replacement pending: 1 of 2 actors alive")


def test_crashes_past_the_budget_end_the_run() -> None:
    members, _, _ = membership(lambda i, n: Script(), actors=2, max_actor_restarts=1)
    members.start()
    members.replace(0, crash(0))
    with pytest.raises(RunFailure, match=r"2 actor restarts within 600s exceeds faults.max_actor_restarts=1"):
        members.replace(1, crash(1))


def test_below_the_floor_the_wait_says_what_is_missing_until_replacements_join() -> None:
    """Both actors lost; their replacements wait 15 s for room, then take 10 s to make their envs."""
    members, calls, events = membership(
        lambda i, n: Script() if n == 0 else Script(placed_s=15, start_s=10), actors=2, min_actors=1)
    members.start()
    for i in (0, 1):
        members.replace(i, preempted(i))
    lost_at = calls.time
    members.wait_for(members.floor_met, "to come back")
    assert members.alive == [0, 1] and calls.time == lost_at + 25
    assert waiting_lines(events) == [
        "waiting for actors to come back: 0 of 2 alive (faults.min_actors=1); 2 not placed yet (the cluster has no "
        "room for them)",
        "waiting for actors to come back: 0 of 2 alive (faults.min_actors=1); 2 placed, still starting (making "
        "their envs)"]
    assert events.messages[-2:] == ["actor 0 back after 25.0 s: 1 of 2 actors alive",
                                    "actor 1 back after 25.0 s: 2 of 2 actors alive"]


def test_a_stop_while_waiting_for_the_floor_ends_the_wait() -> None:
    polls = iter(range(1000))
    members, calls, _ = membership(lambda i, n: Script(placed_s=NEVER) if n else Script(), actors=1,
                                   should_stop=lambda: next(polls) >= 5)
    members.start()
    members.replace(0, crash(0))
    with pytest.raises(Stop):
        members.wait_for(members.floor_met, "to come back")
    assert members.pending == [0] and calls.time == 5.0  # one poll a second, no more


def test_a_replacement_never_placed_ends_the_run_after_the_wait_timeout_saying_what_it_waited_for() -> None:
    """A run never waits forever: below the floor for faults.actor_wait_timeout_s, one line that says for what."""
    members, calls, events = membership(lambda i, n: Script(placed_s=NEVER) if n else Script(), actors=2,
                                        min_actors=2, actor_wait_timeout_s=120)
    members.start()
    members.replace(1, preempted(1))
    lost_at = calls.time
    with pytest.raises(RunFailure) as failed:
        members.wait_for(members.floor_met, "to come back")
    assert calls.time == lost_at + 120 and len(waiting_lines(events)) == 11  # said every 10 s meanwhile
    assert str(failed.value) == (
        "waited 120 s for actors to come back (faults.actor_wait_timeout_s=120): 1 of 2 alive "
        "(faults.min_actors=2); 1 not placed yet (the cluster has no room for it); give the cluster room for them, "
        "lower faults.min_actors or raise faults.actor_wait_timeout_s")


def test_at_start_an_actor_that_never_makes_its_envs_ends_the_run_and_every_actor_is_stopped() -> None:
    members, calls, _ = membership(lambda i, n: Script(start_s=NEVER), actors=1, actor_wait_timeout_s=300)
    with pytest.raises(RunFailure, match=r"^waited 300 s for actors to be placed and start .*1 placed, still "
                                         r"starting \(making its envs\)"):
        members.start()
    assert calls.time == 300 and all(actor.killed for actor in calls.actors) and members.slots == []


def test_without_a_wait_timeout_the_floor_is_waited_for_as_long_as_it_takes() -> None:
    config = load_config(overrides={"run.actors": 1}, sets=["faults.actor_wait_timeout_s=null"])
    calls = FakeRayCalls(lambda i, n: Script(placed_s=5000) if n else Script())
    members = Membership(config, Events(), lambda: False, calls)
    members.start()
    members.replace(0, preempted(0))
    members.wait_for(members.floor_met, "to come back")
    assert members.alive == [0] and calls.time >= 5000
