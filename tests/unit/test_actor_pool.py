"""The actor pool on fake Ray calls and fake time: segments in actor order, the deadline and its minimum segment
count, lost actors and the round topped up to the floor, NaN data, task errors, a stop mid-round, and rounds
under actors that fail at random."""

from __future__ import annotations

import math
import random

import pytest
import ray
from fake_ray import Call, Events, FakeRayCalls, Script, crash, preempted

from dppo.config import load_config
from dppo.distributed.actor_pool import ActorPool
from dppo.distributed.membership import POLL_S, Stop
from dppo.errors import RunFailure
from dppo.rl.sampler import EnvFailure

NEVER = math.inf


def pool(script, actors: int = 4, should_stop=lambda: False, **faults) -> tuple[ActorPool, FakeRayCalls, Events]:
    config = load_config(overrides={"run.actors": actors, **{f"faults.{k}": v for k, v in faults.items()}})
    calls, events = FakeRayCalls(script), Events()
    actor_pool = ActorPool(config, events, should_stop, calls)
    actor_pool.start()
    return actor_pool, calls, events


def calls_taking(seconds: dict[int, float]):
    """Slot i's first actor answers every call after seconds[i] (1 s if not given); replacements after 1 s."""
    return lambda i, n: Script(calls=lambda k: Call(seconds.get(i, 1.0) if n == 0 else 1.0))


def test_segments_come_back_in_actor_order_whatever_order_they_arrive_in() -> None:
    actor_pool, calls, _ = pool(calls_taking({0: 4, 1: 3, 2: 2, 3: 1}))
    gathered = actor_pool.gather(actor_pool.dispatch("weights v1"))
    assert [s.actor_id for s in gathered.segments] == [0, 1, 2, 3] and calls.time == 4.0
    assert all(s.broadcast == "weights v1" for s in gathered.segments)
    assert [calls.get(ref) for ref in gathered.refs] == gathered.segments  # the refs a remote learner reads


def test_a_straggler_past_the_deadline_is_dropped_once_enough_segments_are_in() -> None:
    actor_pool, calls, events = pool(calls_taking({3: 100}), sample_timeout_s=5, min_actors_fraction=0.5)
    gathered = actor_pool.gather(actor_pool.dispatch("b"))
    assert [s.actor_id for s in gathered.segments] == [0, 1, 2] and calls.time == 5.0
    assert events.dropped == ["late"] and events.messages == ["actor 3: segment missed the 5s deadline; dropped"]


def test_past_the_deadline_the_round_waits_for_its_minimum_without_spinning() -> None:
    """0.75 of 4 actors: three segments are needed; the third arrives at 50 s, long after the 5 s deadline."""
    actor_pool, calls, events = pool(calls_taking({2: 50, 3: 200}), sample_timeout_s=5, min_actors_fraction=0.75)
    start = len(calls.waits)
    gathered = actor_pool.gather(actor_pool.dispatch("b"))
    assert [s.actor_id for s in gathered.segments] == [0, 1, 2] and calls.time == 50.0
    assert events.dropped == ["late"]
    assert len(calls.waits) - start <= 50 / POLL_S + 5  # one wait a second after the deadline, not a busy loop


def test_the_floor_raises_the_segments_a_deadline_needs() -> None:
    """faults.min_actors=3 of 4 with a fraction of 0.25: the deadline cuts the round at three segments, not one."""
    actor_pool, calls, _ = pool(calls_taking({1: 30, 2: 40, 3: 50}), sample_timeout_s=5, min_actors_fraction=0.25,
                                min_actors=3)
    gathered = actor_pool.gather(actor_pool.dispatch("b"))
    assert [s.actor_id for s in gathered.segments] == [0, 1, 2] and calls.time == 40.0


def test_a_lost_actor_costs_its_segment_and_its_replacement_joins_the_next_round() -> None:
    def script(i: int, n: int) -> Script:
        if (i, n) == (1, 0):
            return Script(calls=lambda k: Call(2.0, error=crash(1)))
        return Script(start_s=3.0 if n else 0.0)

    actor_pool, calls, events = pool(script, actors=3)
    gathered = actor_pool.gather(actor_pool.dispatch("b1"))
    assert [s.actor_id for s in gathered.segments] == [0, 2] and events.losses == [(1, "crash", "node-a")]
    assert actor_pool.pending == [1]
    calls.time += 5  # the replacement made its envs meanwhile
    gathered = actor_pool.gather(actor_pool.dispatch("b2"))
    replacement = calls.actors[-1]
    assert [s.actor_id for s in gathered.segments] == [0, 1, 2] and gathered.segments[1].seed == replacement.seed
    assert "actor 1 back after 5.0 s: 3 of 3 actors alive" in events.messages


def test_a_round_that_losses_leave_below_the_floor_is_topped_up_by_the_replacements() -> None:
    """min_actors=3 of 4: a node with actors 2 and 3 goes mid-round; the round waits until a replacement is
    alive, asks it (and the other) with the same broadcast, and trains on four segments, not two."""
    def script(i: int, n: int) -> Script:
        if i >= 2 and n == 0:
            return Script(node="node-b", calls=lambda k: Call(2.0, error=crash(i), node_lost=True))
        return Script(placed_s=20.0 if n else 0.0, start_s=5.0 if n else 0.0)

    actor_pool, calls, events = pool(script, min_actors=3)
    gathered = actor_pool.gather(actor_pool.dispatch("b"))
    assert [s.actor_id for s in gathered.segments] == [0, 1, 2, 3]
    assert all(s.broadcast == "b" for s in gathered.segments)
    assert [s.seed for s in gathered.segments[2:]] == [a.seed for a in calls.actors[-2:]]  # the replacements'
    assert events.losses == [(2, "node", "node-b"), (3, "node", "node-b")]
    assert calls.time == 2 + 20 + 5 + 1  # lost at 2 s, placed 20 s and ready 5 s later, then one 1 s call
    assert next(m for m in events.messages if m.startswith("waiting")) == (
        "waiting for actors to come back: 2 of 4 alive (faults.min_actors=3); 2 not placed yet (the cluster has no "
        "room for them)")
    assert [a.calls_made for a in calls.actors[:2]] == [1, 1]  # the actors that delivered are not asked twice


def test_a_round_that_lost_every_actor_is_asked_again() -> None:
    actor_pool, calls, events = pool(
        lambda i, n: Script(calls=lambda k: Call(1.0, error=preempted(i))) if n == 0 else Script(start_s=2.0),
        actors=2)
    gathered = actor_pool.gather(actor_pool.dispatch("b"))
    assert [s.actor_id for s in gathered.segments] == [0, 1] and len(events.losses) == 2
    assert [s.seed for s in gathered.segments] == [a.seed for a in calls.actors[2:]]


def test_nan_segments_are_dropped_and_counted_and_a_round_of_only_nan_is_a_failure() -> None:
    actor_pool, _, events = pool(lambda i, n: Script(calls=lambda k: Call(nonfinite=i == 0 or k > 0)), actors=2,
                                 nonfinite_data="drop")
    gathered = actor_pool.gather(actor_pool.dispatch("b"))
    assert [s.actor_id for s in gathered.segments] == [1] and events.dropped == ["nonfinite"]
    assert events.messages == ["actor 0: NaN/Inf in env CartPole-v1 data; segment dropped"]
    with pytest.raises(RunFailure, match="no usable segment arrived this iteration"):
        actor_pool.gather(actor_pool.dispatch("b"))


def test_nan_data_ends_the_run_by_default_naming_the_env_and_the_fix() -> None:
    actor_pool, _, _ = pool(lambda i, n: Script(calls=lambda k: Call(nonfinite=i == 1)), actors=2)
    with pytest.raises(RunFailure, match=r"env CartPole-v1 \(actor 1\) returned NaN/Inf .* faults.nonfinite_data=drop"):
        actor_pool.gather(actor_pool.dispatch("b"))


def test_an_env_that_keeps_failing_ends_the_run_with_its_traceback() -> None:
    failure = EnvFailure("env CartPole-v1 raised ValueError in step()", details="Traceback ...")
    error = ray.exceptions.RayTaskError("sample", "Traceback ...", failure, pid=1, ip="127.0.0.1")
    actor_pool, _, _ = pool(lambda i, n: Script(calls=lambda k: Call(error=error if i == 0 else None)), actors=2)
    with pytest.raises(RunFailure, match=r"actor 0: env CartPole-v1 raised ValueError") as caught:
        actor_pool.gather(actor_pool.dispatch("b"))
    assert caught.value.details == "Traceback ..."


def test_a_stop_mid_round_ends_the_gather() -> None:
    stop = []
    actor_pool, calls, _ = pool(calls_taking({1: 100}), actors=2, should_stop=lambda: bool(stop))
    round_ = actor_pool.dispatch("b")
    stop.append(True)
    with pytest.raises(Stop):
        actor_pool.gather(round_)
    assert calls.time < 100


@pytest.mark.parametrize("seed", range(12))
def test_under_actors_failing_at_random_every_round_has_the_floor_or_the_run_fails_as_documented(seed: int) -> None:
    """Crashes, nodes preempted mid-call or before a replacement is ready, stragglers, replacements that wait for
    room: every round holds at least faults.min_actors segments, one per slot, in actor order, sampled with its
    own broadcast; or the run ends with the crash-loop error. No killed actor is ever asked to sample."""
    rng = random.Random(seed)
    deadline = rng.choice([None, 8.0])

    def call(i: int) -> Call:
        roll = rng.random()
        if roll < 0.06:
            return Call(rng.uniform(0, 3), error=crash(i))
        if roll < 0.12:
            return Call(rng.uniform(0, 3), error=preempted(i))
        return Call(rng.choice([1.0, 1.5, 30.0]) if roll < 0.2 else rng.uniform(0.5, 2))

    def script(i: int, n: int) -> Script:
        if n == 0:
            return Script(start_s=rng.uniform(0, 3), calls=lambda k: call(i))
        lost_first = rng.random() < 0.1
        return Script(placed_s=rng.choice([0, 0, 5, 40]), start_s=rng.uniform(0, 5),
                      ready_error=preempted(i) if lost_first else None, calls=lambda k: call(i))

    actor_pool, _, _ = pool(script, actors=5, min_actors=3, sample_timeout_s=deadline, min_actors_fraction=0.6,
                                max_actor_restarts=rng.choice([3, 1000]))
    rounds = 0
    try:
        for version in range(40):
            gathered = actor_pool.gather(actor_pool.dispatch(version))
            ids = [s.actor_id for s in gathered.segments]
            assert len(ids) >= 3 and ids == sorted(set(ids))
            assert all(s.broadcast == version for s in gathered.segments)
            rounds += 1
    except RunFailure as err:
        assert "actor restarts within" in str(err) and "exceeds faults.max_actor_restarts=3" in str(err)
    assert rounds == 40 or actor_pool.membership.crashes.limit == 3
