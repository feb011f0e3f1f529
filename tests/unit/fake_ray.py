"""Fake Ray calls for in-process tests of the actor pool, the membership and the coordinator.

A :class:`FakeRayCalls` runs on fake time: every call an actor answers finishes at a fake instant, ``wait``
advances the clock to the next finish (or by its timeout), so deadlines, floor waits and "waiting" lines are
tested without sleeping. Each fake actor follows a script: when Ray places it, when its envs are made, and what
each of its sample calls does (take so long, crash, go with its node, return NaN data).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from dppo.distributed.ray_calls import Placement, RayCalls


def crash(index: int) -> ray.exceptions.RayActorError:
    """What ray.get raises for an actor whose process died on a live node."""
    return ray.exceptions.RayActorError(error_msg=f"actor {index}'s process died")


def preempted(index: int) -> ray.exceptions.RayActorError:
    """What ray.get raises for an actor whose node was preempted."""
    return ray.exceptions.RayActorError(error_msg=f"actor {index}'s node was preempted", preempted=True)


@dataclass
class Call:
    """What one sample call does: finish after ``seconds``, then return a segment (NaN data when ``nonfinite``)
    or raise ``error``; ``node_lost``: the actor's node is gone by then (ray.nodes() no longer lists it)."""

    seconds: float = 1.0
    error: Exception | None = None
    nonfinite: bool = False
    node_lost: bool = False


@dataclass
class Script:
    """A fake actor's life: placed after ``placed_s``, ready ``start_s`` later (or ``ready_error`` then), then
    ``calls(n)`` says what its n-th sample call does."""

    placed_s: float = 0.0
    start_s: float = 0.0
    ready_error: Exception | None = None
    problem: str | None = None  # ready() reports that its env cannot be made
    calls: Callable[[int], Call] = lambda n: Call()
    node: str = "node-a"


@dataclass(frozen=True)
class FakeSegment:
    """What the pool reads of a segment."""

    actor_id: int
    seed: int
    broadcast: Any
    nonfinite: bool = False


class FakeRef:
    """An object ref: its value (or error) and the fake instant it is ready at."""

    def __init__(self, at: float, value: Any = None, error: Exception | None = None) -> None:
        self.at, self.value, self.error = at, value, error


class Method:
    def __init__(self, call: Callable[..., FakeRef]) -> None:
        self.remote = call


class FakeActor:
    """A fake actor handle: ``handle.ready.remote()`` and ``handle.sample.remote(broadcast)`` as Ray's (and
    ``evaluate`` and ``load``, sample calls under the evaluation actor's and the inference service's names)."""

    def __init__(self, ray_calls: FakeRayCalls, index: int, seed: int, script: Script,
                 sample: Callable[[int, int, Any], Any] | None = None) -> None:
        self.ray_calls, self.index, self.seed, self.script = ray_calls, index, seed, script
        self.started = ray_calls.time
        self.placed_at = self.started + script.placed_s
        self.ready_at = self.placed_at + script.start_s
        self.make_segment = sample or (lambda i, s, b: FakeSegment(i, s, b))
        self.calls_made = 0
        self.busy_until = self.ready_at  # calls run one at a time, after the constructor, as in a Ray actor
        self.killed = False
        self.ready = Method(self._ready)
        self.sample = Method(self._sample)
        self.evaluate = Method(lambda broadcast, episodes, seed: self._sample(broadcast))  # as a sample call
        self.load = Method(lambda weights, version: self._sample(version))  # the inference service's, likewise

    def _ready(self) -> FakeRef:
        if self.script.ready_error is not None:
            return FakeRef(self.ready_at, error=self.script.ready_error)
        return FakeRef(self.ready_at, (self.script.problem, self.script.node))

    def _sample(self, broadcast: Any) -> FakeRef:
        assert not self.killed, f"actor {self.index} was asked to sample after it was killed"
        call = self.script.calls(self.calls_made)
        self.calls_made += 1
        at = self.busy_until = max(self.ray_calls.time, self.busy_until) + call.seconds
        if call.node_lost:
            self.ray_calls.node_deaths.append((at, self.script.node))
        if call.error is not None:
            return FakeRef(at, error=call.error)
        segment = self.make_segment(self.index, self.seed, broadcast)
        if call.nonfinite:
            segment = FakeSegment(self.index, self.seed, broadcast, nonfinite=True)
        return FakeRef(at, segment)


class FakeRayCalls(RayCalls):
    """The Ray calls on fake time; ``script(index, spawn)`` gives the spawn-th actor started (0-based, replacements
    included) in slot ``index`` its life."""

    def __init__(self, script: Callable[[int, int], Script] = lambda index, spawn: Script(),
                 sample: Callable[[int, int, Any], Any] | None = None) -> None:
        super().__init__(self._start_fake)
        self.script, self.sample_fn = script, sample
        self.time = 0.0
        self.actors: list[FakeActor] = []  # every actor started, in order
        self.spawns_in: dict[int, itertools.count] = {}
        self.node_deaths: list[tuple[float, str]] = []  # (when, node)
        self.waits: list[float] = []  # every wait's timeout (a wait of 0 that repeats forever is a spin)

    def _start_fake(self, index: int, seed: int) -> FakeActor:
        spawn = next(self.spawns_in.setdefault(index, itertools.count()))
        actor = FakeActor(self, index, seed, self.script(index, spawn), self.sample_fn)
        self.actors.append(actor)
        return actor

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> list[Any]:
        assert len(self.waits) < 100_000, "the code under test keeps waiting: a loop that never ends"
        self.waits.append(timeout)
        times = sorted(ref.at for ref in refs)
        nth = times[num_returns - 1]
        self.time = max(self.time, min(nth, self.time + timeout))
        ready = sorted((ref for ref in refs if ref.at <= self.time), key=lambda ref: ref.at)
        return ready[:num_returns]

    def get(self, ref: FakeRef) -> Any:
        assert ref.at <= self.time, "get() of a ref that is not ready yet would block"
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, handle: FakeActor) -> None:
        handle.killed = True

    def alive_nodes(self) -> set[str]:
        dead = {node for at, node in self.node_deaths if at <= self.time}
        return {actor.script.node for actor in self.actors} - dead

    def placement(self, handle: FakeActor) -> Placement:
        return Placement(self.time >= handle.placed_at, handle.script.node)

    def now(self) -> float:
        return self.time


@dataclass
class Events:
    """A PoolEvents that keeps what it is told."""

    messages: list[str] = field(default_factory=list)
    losses: list[tuple[int, str, str | None]] = field(default_factory=list)
    counts: list[tuple[int, int]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def message(self, text: str) -> None:
        self.messages.append(text)

    def actor_lost(self, index: int, cause: str, node: str | None) -> None:
        self.losses.append((index, cause, node))

    def actors_changed(self, alive: int, pending: int) -> None:
        self.counts.append((alive, pending))

    def segment_dropped(self, reason: str) -> None:
        self.dropped.append(reason)
