"""Hangs are faults like crashes (issue 62): each wait's deadline comes from the run's own timings (or
faults.hang_timeout_s); past it the process is said hung in one line, killed and replaced as a crashed one, counted
apart and spent from its own budget. On fake Ray calls and fake time: nothing sleeps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import pytest
from fake_ray import Call, Events, FakeRayCalls, Method, Script

from dppo.config import load_config
from dppo.distributed.actor_pool import ActorPool
from dppo.distributed.broadcast import Broadcast
from dppo.distributed.deadlines import HANG_FLOOR_S, Deadline, Hangs
from dppo.distributed.evaluation import Evaluation
from dppo.distributed.service_supervisor import ServiceSupervisor
from dppo.errors import RunFailure

NEVER = math.inf


@dataclass
class HangEvents(Events):
    """Pool events that keep the hang lines too."""

    hangs: list[tuple[str, str]] = field(default_factory=list)

    def hung(self, process: str, line: str) -> None:
        self.hangs.append((process, line))


def config(**faults: object):
    return load_config(overrides={"run.actors": 2, "run.eval_every": 1,
                                  **{f"faults.{k}": v for k, v in faults.items()}})


def test_a_deadline_is_the_floor_until_ten_times_the_median_is_longer_and_the_key_overrides_it() -> None:
    deadline = Deadline(None)
    assert deadline.seconds == HANG_FLOOR_S and "faults.hang_timeout_s" in deadline.describe()
    for seconds in (1.0, 2.0, 3.0):
        deadline.observe(seconds)
    assert deadline.seconds == HANG_FLOOR_S  # 10 x 2 s is under the floor
    for seconds in (20.0, 30.0, 40.0, 50.0):
        deadline.observe(seconds)
    assert deadline.seconds == 200.0 and "the median so far, 20.00 s)" in deadline.describe()
    fixed = Deadline(2.5)
    fixed.observe(100.0)
    assert fixed.seconds == 2.5 and fixed.describe().startswith("2.5 s (faults.hang_timeout_s)")


def test_an_actor_that_never_answers_is_said_hung_killed_and_replaced_and_the_round_goes_on() -> None:
    script = lambda i, spawn: Script(calls=lambda n: Call(NEVER if (i, spawn, n) == (1, 0, 2) else 1.0))  # noqa: E731
    calls, events = FakeRayCalls(script), HangEvents()
    pool = ActorPool(config(), events, lambda: False, calls)
    pool.start()
    for _ in range(2):
        assert len(pool.gather(pool.dispatch("b")).segments) == 2
    began = calls.now()
    gathered = pool.gather(pool.dispatch("b"))  # actor 1's third call never returns
    assert [s.actor_id for s in gathered.segments] == [0]
    ((process, line),) = events.hangs
    assert process == "actor" and line.startswith("actor 1 hung: sampling a segment") and "60 s" in line
    assert calls.now() - began >= HANG_FLOOR_S  # not before its deadline (max(60 s, 10 x the 1 s median))
    assert events.losses == [(1, "hang", "node-a")] and calls.actors[1].killed and len(calls.actors) == 3
    assert not pool.membership.crashes.times  # a hang spends no crash budget
    assert any("actor 1 killed (hung)" in text for text in events.messages)
    assert len(pool.gather(pool.dispatch("b")).segments) == 2  # the replacement samples from the next round


def test_the_upstream_check_comes_first_and_a_hang_loop_ends_the_run_past_its_budget() -> None:
    calls, events = FakeRayCalls(lambda i, spawn: Script(calls=lambda n: Call(NEVER))), HangEvents()
    pool = ActorPool(config(hang_timeout_s=5, max_hang_restarts=2), events, lambda: False, calls)
    checked: list[float] = []
    pool.upstream = lambda: checked.append(calls.now())
    pool.start()
    with pytest.raises(RunFailure, match=r"faults\.max_hang_restarts=2"):
        for _ in range(3):
            pool.gather(pool.dispatch("b"))
    assert len(events.hangs) == 3 and checked and all(t >= 5 for t in checked)
    assert "5 s (faults.hang_timeout_s)" in events.hangs[0][1]


def test_an_evaluation_that_never_answers_is_hung_after_its_start_grace_and_a_new_actor_evaluates_next() -> None:
    calls = FakeRayCalls(lambda i, spawn: Script(calls=lambda n: Call(NEVER if spawn == 0 else 2.0)),
                         sample=lambda index, seed, broadcast: [1.0])
    events = HangEvents()
    evaluated = config(hang_timeout_s=10, actor_start_timeout_s=20)
    evaluation = Evaluation(evaluated, calls, Hangs(evaluated.faults, events, calls.now))
    evaluation.submit("weights", iteration=1, env_steps=100)
    assert evaluation.collect(timeout_s=25.0) is None and not events.hangs  # within 10 s + its start's 20 s
    assert evaluation.collect(timeout_s=10.0) is None
    ((process, line),) = events.hangs
    assert process == "evaluation" and "evaluating the weights at 100 env steps" in line
    assert evaluation.in_flight is None and calls.actors[0].killed and evaluation.group.losses["hang"] == 1
    evaluation.submit("weights", iteration=2, env_steps=200)
    assert evaluation.collect(timeout_s=5.0).returns == [1.0] and len(calls.actors) == 2


class PingedCalls(FakeRayCalls):
    """Fake calls whose actors answer ``ping`` as a call of their script (the inference service's)."""

    def _start_fake(self, index: int, seed: int):
        actor = super()._start_fake(index, seed)
        actor.ping = Method(lambda: actor._sample(None))
        return actor


def test_a_service_that_never_answers_a_load_or_a_ping_is_hung_and_replaced_holding_the_versions() -> None:
    calls = PingedCalls(lambda i, spawn: Script(calls=lambda n: Call(NEVER if spawn == 0 and n >= 1 else 0.1)))
    events = HangEvents()
    env = gym.make("CartPole-v1")
    served_config = config(hang_timeout_s=4)
    supervisor = ServiceSupervisor(served_config, env.observation_space, env.action_space, "cpu", events.message,
                                   calls, Hangs(served_config.faults, events, calls.now))
    supervisor.start()
    first = supervisor.serve(Broadcast({"w": np.zeros(2)}, 1, None, None))
    served = supervisor.serve(Broadcast({"w": np.ones(2)}, 2, None, None))  # the first service never loads it
    ((process, line),) = events.hangs
    assert process == "inference" and line.startswith("the inference service hung: loading the weights for 4.0 s")
    assert calls.actors[0].killed and served.spawns == 2 and first.spawns == 1
    assert calls.actors[1].calls_made == 2  # the replacement loaded versions 1 and 2
    supervisor.check()  # the replacement answers its ping
    assert len(events.hangs) == 1
