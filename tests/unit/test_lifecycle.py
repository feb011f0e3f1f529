"""The shared actor lifecycle on fake Ray calls and fake time, with actors that fail at random (seeded): every loss
counted by its cause, only crashes spend the budget, no call reaches a killed actor, every actor started gets a
seed of its own; the two variants the groups use (no ready call; the owner keeps the budget), and the evaluation
actor and the inference service on it."""

from __future__ import annotations

import math
import random
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
import ray
from fake_ray import Call, FakeRayCalls, Script, crash, preempted

from dppo.config import load_config
from dppo.distributed.broadcast import Broadcast
from dppo.distributed.evaluation import Evaluation
from dppo.distributed.lifecycle import ActorGroup
from dppo.distributed.restarts import RestartBudget
from dppo.distributed.service_supervisor import ServiceSupervisor
from dppo.errors import RunFailure
from dppo.rl.sampler import actor_seed


class RandomFailures:
    """Scripts for a group whose actors fail at random: each call crashes, goes with its preempted node, finds its
    node gone (a plain actor error, told apart by ray.nodes()), or answers; a replacement sometimes never becomes
    ready (its node preempted first). Each actor runs on a node of its own, so a dead node takes only that actor.
    ``planned`` is every failure handed out, by cause, to compare with what the group counted."""

    def __init__(self, seed: int, failure: float = 0.2) -> None:
        self.seed, self.failure = seed, failure
        self.planned: Counter[str] = Counter()

    def script(self, index: int, spawn: int) -> Script:
        rng = random.Random(f"{self.seed}/{index}/{spawn}")
        node = f"node-{index}-{spawn}"
        if spawn and rng.random() < self.failure / 2:
            self.planned["node"] += 1
            return Script(start_s=rng.uniform(0, 3), ready_error=preempted(index), node=node)

        def call(n: int) -> Call:
            draw, seconds = rng.random(), rng.uniform(0.5, 2.0)
            if draw >= self.failure:
                return Call(seconds)
            kind = ("crash", "preempted", "node_lost")[int(draw / self.failure * 3)]
            self.planned["crash" if kind == "crash" else "node"] += 1
            if kind == "crash":
                return Call(seconds, error=crash(index))
            if kind == "preempted":
                return Call(seconds, error=preempted(index))
            return Call(seconds, error=ray.exceptions.RayActorError(error_msg="unreachable"), node_lost=True)

        return Script(start_s=rng.uniform(0, 3), calls=call, node=node)


def drive(group: ActorGroup, calls: FakeRayCalls, rounds: int) -> None:
    """What a group's owner does: promote ready actors, call every alive one, replace the lost ones."""
    for _ in range(rounds):
        starting = group.starting()
        for ref in calls.wait(list(starting), len(starting), timeout=1.0) if starting else []:
            index = starting[ref]
            try:
                _problem, node = calls.get(ref)
            except ray.exceptions.RayActorError as err:
                group.replace(index, err)
                continue
            group.mark_ready(index, node)
        refs = {group.slots[i].handle.sample.remote(None): i for i in group.alive}
        if not refs:
            continue
        for ref in calls.wait(list(refs), len(refs), timeout=math.inf):
            try:
                calls.get(ref)
            except ray.exceptions.RayActorError as err:
                group.replace(refs[ref], err)


@pytest.mark.parametrize("seed", range(6))
def test_random_failures_are_counted_by_cause_and_only_crashes_spend_the_budget(seed: int) -> None:
    failures = RandomFailures(seed)
    calls = FakeRayCalls(failures.script)  # its actors refuse any call after they were killed
    budget = RestartBudget("actor", limit=10_000, window_s=1e9, clock=calls.now)
    group = ActorGroup(calls, lambda index, spawn: actor_seed(seed, index, spawn), budget)
    group.start(5)
    drive(group, calls, rounds=60)
    doomed = sum(group.slots[i].handle.script.ready_error is not None for i in group.pending)  # not failed yet
    assert group.losses + Counter(node=doomed) == failures.planned
    assert group.losses["crash"] and group.losses["node"]
    assert len(budget.times) == group.losses["crash"]
    started = calls.actors
    assert len(started) == 5 + sum(group.losses.values()) == group.spawns
    assert len({actor.seed for actor in started}) == len(started)  # every replacement has a fresh seed
    assert [a.seed for a in started] == [actor_seed(seed, a.index, n) for n, a in enumerate(started)]
    assert sum(actor.killed for actor in started) == len(started) - 5  # each lost one killed, the current ones not
    assert not any(slot.handle.killed for slot in group.slots)
    group.shutdown()
    assert all(actor.killed for actor in started) and group.slots == []


def test_a_crash_loop_ends_the_run_and_node_losses_never_do() -> None:
    calls = FakeRayCalls(lambda index, spawn: Script(node=f"node-{spawn}"))
    group = ActorGroup(calls, lambda index, spawn: spawn, RestartBudget("actor", 2, 60.0, clock=calls.now))
    group.start(1)
    for _ in range(5):
        group.replace(0, preempted(0))
    assert group.losses == Counter(node=5)
    group.replace(0, crash(0))
    group.replace(0, crash(0))
    with pytest.raises(RunFailure, match=r"3 actor restarts within 60s exceeds faults\.max_actor_restarts=2"):
        group.replace(0, crash(0))
    assert group.losses == Counter(node=5, crash=3)


def test_a_group_without_ready_calls_is_alive_at_once_and_an_owner_may_keep_the_budget() -> None:
    """The learners and the evaluation actor: alive when started (their first call tells), no budget of the
    group's own (the run keeps the learners'; evaluation never ends the run)."""
    calls = FakeRayCalls()
    group = ActorGroup(calls, lambda index, spawn: 7, ready_call=False)
    group.start(3)
    assert group.alive == [0, 1, 2] and group.pending == [] and group.starting() == {}
    loss = group.replace(1, crash(1))
    assert (loss.index, loss.cause, loss.node) == (1, "crash", "node-a") and group.alive == [0, 1, 2]
    assert calls.actors[1].killed and group.slots[1].handle is calls.actors[3] and group.slots[1].replacement


def test_a_lost_evaluation_actor_is_counted_and_replaced_when_the_next_evaluation_is_due() -> None:
    """Its first call crashes: no result, nothing waited for, the loss counted (never spending a budget), and the
    next due evaluation starts a new actor, which answers."""
    config = load_config(overrides={"run.eval_every": 2})
    calls = FakeRayCalls(lambda index, spawn: Script(calls=lambda n: Call(error=crash(index) if spawn == 0 else None)),
                         sample=lambda index, seed, broadcast: [1.0, 3.0])
    evaluation = Evaluation(config, calls)
    evaluation.submit("weights 2", iteration=2, env_steps=100)
    first = evaluation.actor
    assert evaluation.collect(timeout_s=0.0) is None and evaluation.in_flight is not None  # not done: not waited
    assert evaluation.collect(timeout_s=5.0) is None and evaluation.actor is None and first.killed
    assert evaluation.group.losses == Counter(crash=1) and evaluation.on
    evaluation.submit("weights 3", iteration=3, env_steps=150)  # not due
    assert evaluation.in_flight is None
    evaluation.submit("weights 4", iteration=4, env_steps=200)
    result = evaluation.collect(timeout_s=5.0)
    assert (result.iteration, result.returns, result.mean) == (4, [1.0, 3.0], 2.0) and evaluation.actor is not first
    evaluation.shutdown()
    assert all(actor.killed for actor in calls.actors)


def test_the_inference_service_is_replaced_on_any_loss_and_only_its_crashes_spend_the_budget() -> None:
    """Its first service goes with its preempted node, the second crashes: two replacements, one crash spent (its
    calls answer at once: the driver side reads a load without waiting)."""
    config = load_config(overrides={"faults.max_actor_restarts": 5})
    fails = {(0, 1): preempted(0), (1, 2): crash(0)}  # (spawn, call): the 2nd service's loads: v1, v2, then v3
    calls = FakeRayCalls(lambda index, spawn: Script(calls=lambda n: Call(0.0, error=fails.get((spawn, n)))))
    env = gym.make("CartPole-v1")
    said: list[str] = []
    inference = ServiceSupervisor(config, env.observation_space, env.action_space, "cpu", said.append, calls)
    inference.start()
    weights = {"w": np.zeros(2)}
    inference.serve(Broadcast(weights, 1, None, None))
    served = inference.serve(Broadcast(weights, 2, None, None))  # the first service's second call: preempted
    served = inference.serve(Broadcast(weights, 3, None, None))  # the second's: crashed
    assert inference.group.losses == Counter(node=1, crash=1) and len(inference.group.crashes.times) == 1
    assert served.spawns == 3 and served.service is calls.actors[2] and calls.actors[0].killed
    assert [line.split("(")[0] for line in said] == ["the inference service was lost "] * 2 and "loss 2" in said[1]
