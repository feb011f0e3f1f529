"""Elastic membership: the N actor slots of a run and the life of the actor in each.

Nodes come and go (preemption, drains, evictions, the autoscaler), so each slot holds an actor that is *alive*
(placed, envs made: it samples) or *pending* (a replacement Ray has not placed or started yet: it gets no
calls). A lost actor's replacement is created at once, with a fresh seed, and becomes alive when its ``ready()``
answers; below ``faults.min_actors`` alive actors the run waits, and says so: how many pending actors the
cluster has no room for, and how many are placed and still making their envs. Losses are told apart: an actor
that went with its node (preempted, the node dead or unreachable) is a node loss, one whose process died on a
live node a crash, and only crashes spend the crash-loop budget. Every Ray call goes through ``calls``
(:class:`~dppo.distributed.ray_calls.RayCalls`), so tests drive all of this with fakes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import ray

from dppo.config import Config
from dppo.distributed.actor import start_actor
from dppo.distributed.ray_calls import RayCalls
from dppo.distributed.restarts import RestartBudget
from dppo.envs.user_code import EnvLoadError
from dppo.errors import RunFailure, first_line
from dppo.rl.sampler import actor_seed

POLL_S = 1.0  # how often waits check for a stop request, and for pending actors that became ready
REPORT_EVERY_S = 10.0  # how often a wait for actors says so


class Stop(Exception):
    """A stop was requested (SIGTERM/SIGINT) while the pool was waiting."""


class PoolEvents(Protocol):
    """What the pool tells the run about its actors (the run's reporting implements it)."""

    def message(self, text: str) -> None: ...

    def actor_lost(self, index: int, cause: str, node: str | None) -> None: ...

    def actors_changed(self, alive: int, pending: int) -> None: ...

    def segment_dropped(self, reason: str) -> None: ...


@dataclass
class Slot:
    """One of the N actor places: its actor, and what is known of it."""

    handle: ray.actor.ActorHandle
    starting: ray.ObjectRef | None  # the ready() call of an actor not yet alive (None: alive)
    since: float  # when it started (to say how long a replacement took)
    replacement: bool = False  # it replaces a lost actor (its return is worth a line in the log)
    node: str | None = None  # where it runs, once alive


def actor_calls(config: Config) -> RayCalls:
    """The real Ray calls for a run's sampling actors."""
    return RayCalls(lambda index, seed: start_actor(config, index, seed))


class Membership:
    """The slots: spawn, promote pending actors that are ready, replace lost ones, wait for the floor."""

    def __init__(self, config: Config, events: PoolEvents, should_stop: Callable[[], bool],
                 calls: RayCalls | None = None) -> None:
        self.config, self.events, self.should_stop = config, events, should_stop
        self.calls = calls or actor_calls(config)
        self.slots: list[Slot] = []
        self.spawns = 0  # every actor started in this process, replacements included: each gets its own seed
        faults = config.faults
        self.crashes = RestartBudget("actor", faults.max_actor_restarts, faults.restart_window_s, clock=self.calls.now)

    @property
    def alive(self) -> list[int]:
        return [i for i, slot in enumerate(self.slots) if slot.starting is None]

    @property
    def pending(self) -> list[int]:
        return [i for i, slot in enumerate(self.slots) if slot.starting is not None]

    def start(self) -> None:
        """Spawn the N actors and wait until each has made its envs (an env that an actor cannot import or make
        is bad input before anything is written); after faults.actor_start_timeout_s, start with those ready
        (at least faults.min_actors), and say so in one line."""
        began = self.calls.now()
        self.slots = [self._spawn(i) for i in range(self.config.run.actors)]
        deadline = began + self.config.faults.actor_start_timeout_s
        try:
            self.wait_for(lambda: not self.pending or (self.calls.now() >= deadline and self.floor_met()),
                          "to be placed and start")
        except (RunFailure, EnvLoadError):
            self.shutdown()
            raise
        if self.pending:
            faults, late = self.config.faults, len(self.pending)
            self.events.message(
                f"training starts with {len(self.alive)} of {len(self.slots)} actors after "
                f"{self.calls.now() - began:.0f} s (faults.actor_start_timeout_s={faults.actor_start_timeout_s:g}, "
                f"faults.min_actors={faults.min_actors}): {self.pending_detail()}; "
                f"{'it joins' if late == 1 else 'they join'} when ready")

    def floor_met(self) -> bool:
        return len(self.alive) >= self.config.faults.min_actors

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        """Poll pending actors until ``done()``, saying every REPORT_EVERY_S what the run waits for."""
        said = self.calls.now()
        self.promote(timeout=0.0)
        while not done():
            if self.should_stop():
                raise Stop
            self.promote(timeout=POLL_S)
            if self.calls.now() - said >= REPORT_EVERY_S and not done():
                said = self.calls.now()
                self.events.message(f"waiting for actors {what}: {len(self.alive)} of {len(self.slots)} alive "
                                    f"(faults.min_actors={self.config.faults.min_actors}); {self.pending_detail()}")

    def pending_detail(self) -> str:
        """Why the pending actors are not alive yet, from Ray's placement of each: the cluster has no room for
        them, or they are placed and still starting (slow to make their envs, not short of room)."""
        placed = [self.calls.placement(self.slots[i].handle).placed for i in self.pending]
        parts = []
        if count := placed.count(False):
            parts.append(f"{count} not placed yet (the cluster has no room for {'it' if count == 1 else 'them'})")
        if count := placed.count(True):
            parts.append(f"{count} placed, still starting (making {'its' if count == 1 else 'their'} envs)")
        if count := placed.count(None):
            parts.append(f"{count} pending (Ray does not say where)")
        return "; ".join(parts)

    def promote(self, timeout: float) -> None:
        """Pending actors whose ready() answered become alive (or end the run: their env cannot be made)."""
        starting = {slot.starting: i for i, slot in enumerate(self.slots) if slot.starting is not None}
        if not starting:
            return
        for ref in self.calls.wait(list(starting), num_returns=len(starting), timeout=timeout):
            index = starting[ref]
            slot = self.slots[index]
            try:
                problem, slot.node = self.calls.get(ref)
            except ray.exceptions.RayActorError as err:
                if err.actor_init_failed:  # its constructor raised: the same code fails on any node
                    raise RunFailure(f"actor {index} failed to start: {first_line(err)}") from err
                self.replace(index, err)  # lost before it was ready (its node went away first)
                continue
            if problem is not None:
                raise EnvLoadError(problem)
            slot.starting = None
            if slot.replacement:
                self.events.message(f"actor {index} back after {self.calls.now() - slot.since:.1f} s: "
                                    f"{len(self.alive)} of {len(self.slots)} actors alive")
        self.events.actors_changed(len(self.alive), len(self.pending))

    def _spawn(self, index: int, replacement: bool = False) -> Slot:
        seed = actor_seed(self.config.run.seed, index, self.spawns)
        self.spawns += 1
        handle = self.calls.start(index, seed)
        return Slot(handle, handle.ready.remote(), self.calls.now(), replacement)

    def replace(self, index: int, err: ray.exceptions.RayActorError) -> None:
        """A lost actor: classify the loss (only crashes spend the budget), then a replacement in its slot."""
        node = self.slots[index].node or self.calls.placement(self.slots[index].handle).node
        cause = self.loss_cause(node, err)
        if cause == "crash":
            self.crashes.spend(err)
        self.calls.kill(self.slots[index].handle)
        self.slots[index] = self._spawn(index, replacement=True)
        self.events.actor_lost(index, cause, node)
        what = "lost with its node" if cause == "node" else "crashed"
        self.events.message(f"actor {index} {what} ({type(err).__name__}: {first_line(err)}); replacement pending: "
                            f"{len(self.alive)} of {len(self.slots)} actors alive")
        self.events.actors_changed(len(self.alive), len(self.pending))

    def loss_cause(self, node: str | None, err: ray.exceptions.RayActorError) -> str:
        """"node" when the actor went with its node (preempted, the node dead, or the actor unreachable: its
        node's raylet no longer answers), else "crash" (the process died and its node reported it)."""
        if err.preempted or isinstance(err, ray.exceptions.ActorUnavailableError):
            return "node"
        return "node" if node is not None and node not in self.calls.alive_nodes() else "crash"

    def shutdown(self) -> None:
        for slot in self.slots:
            self.calls.kill(slot.handle)
        self.slots = []
