"""Elastic membership: the N actor slots of a run and the life of the actor in each.

Nodes come and go (preemption, drains, evictions, the autoscaler), so each slot holds an actor that is *alive*
(placed, envs made: it samples) or *pending* (a replacement Ray has not placed or started yet: it gets no
calls). A lost actor's replacement is created at once, with a fresh seed, and becomes alive when its ``ready()``
answers; below ``faults.min_actors`` alive actors the run waits, and says so: how many pending actors the
cluster has no room for, and how many are placed and still making their envs. Losses are told apart: an actor
that went with its node (preempted, the node dead or unreachable) is a node loss, one whose process died on a
live node a crash, and only crashes spend the crash-loop budget. The life of each actor (start, ready, a loss
classified and counted, a replacement) is the shared :class:`~dppo.distributed.lifecycle.ActorGroup`; this module
adds the run's policy over it: the start timeout, the floor and the lines that say what the run waits for. Every Ray
call goes through ``calls`` (:class:`~dppo.distributed.ray_calls.RayCalls`), so tests drive all of this with fakes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import ray

from dppo.config import Config
from dppo.distributed.actor import start_actor
from dppo.distributed.lifecycle import LOSS_WORDS, ActorGroup, Slot
from dppo.distributed.ray_calls import RayCalls
from dppo.distributed.restarts import RestartBudget
from dppo.envs.make import EnvSpec, env_spec
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

    def hung(self, process: str, line: str) -> None: ...


def actor_calls(config: Config, spec: EnvSpec | None = None) -> RayCalls:
    """The real Ray calls for a run's sampling actors, each shipped ``spec``: the env as the driver resolved it once
    (resolved here when not given)."""
    spec = spec or env_spec(config)
    return RayCalls(lambda index, seed: start_actor(config, index, seed, spec))


class Membership:
    """The slots: spawn, promote pending actors that are ready, replace lost ones, wait for the floor."""

    def __init__(self, config: Config, events: PoolEvents, should_stop: Callable[[], bool],
                 calls: RayCalls | None = None) -> None:
        self.config, self.events, self.should_stop = config, events, should_stop
        self.calls = calls or actor_calls(config)
        faults = config.faults
        crashes = RestartBudget("actor", faults.max_actor_restarts, faults.restart_window_s, clock=self.calls.now)
        self.group = ActorGroup(self.calls, lambda index, spawn: actor_seed(config.run.seed, index, spawn), crashes)

    @property
    def slots(self) -> list[Slot]:
        return self.group.slots

    @property
    def crashes(self) -> RestartBudget:
        return self.group.crashes

    @property
    def alive(self) -> list[int]:
        return self.group.alive

    @property
    def pending(self) -> list[int]:
        return self.group.pending

    def start(self) -> None:
        """Spawn the N actors and wait until each has made its envs (an env that an actor cannot import or make
        is bad input before anything is written); after faults.actor_start_timeout_s, start with those ready
        (at least faults.min_actors), and say so in one line."""
        began = self.calls.now()
        self.group.start(self.config.run.actors)
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
        """Poll pending actors until ``done()``, saying every REPORT_EVERY_S what the run waits for; below the floor
        for faults.actor_wait_timeout_s, a RunFailure that says what it waited for (no node with room registered,
        or actors that never finished making their envs): a run never waits forever."""
        began = said = self.calls.now()
        limit = self.config.faults.actor_wait_timeout_s
        self.promote(timeout=0.0)
        while not done():
            if self.should_stop():
                raise Stop
            self.promote(timeout=POLL_S)
            if done():
                return
            waited = self.calls.now() - began
            if limit is not None and waited >= limit and not self.floor_met():
                raise RunFailure(f"waited {waited:.0f} s for actors {what} (faults.actor_wait_timeout_s={limit:g}): "
                                 f"{self.alive_line()}; give the cluster room for them, lower faults.min_actors or "
                                 "raise faults.actor_wait_timeout_s")
            if self.calls.now() - said >= REPORT_EVERY_S:
                said = self.calls.now()
                self.events.message(f"waiting for actors {what}: {self.alive_line()}")

    def alive_line(self) -> str:
        """How many actors are alive against the floor, and why the pending ones are not."""
        return (f"{len(self.alive)} of {len(self.slots)} alive (faults.min_actors={self.config.faults.min_actors}); "
                f"{self.pending_detail()}")

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
        starting = self.group.starting()
        if not starting:
            return
        for ref in self.calls.wait(list(starting), num_returns=len(starting), timeout=timeout):
            index = starting[ref]
            slot = self.slots[index]
            try:
                problem, node = self.calls.get(ref)
            except ray.exceptions.RayActorError as err:
                if err.actor_init_failed:  # its constructor raised: the same code fails on any node
                    raise RunFailure(f"actor {index} failed to start: {first_line(err)}") from err
                self.replace(index, err)  # lost before it was ready (its node went away first)
                continue
            if problem is not None:
                raise EnvLoadError(problem)
            self.group.mark_ready(index, node)
            if slot.replacement:
                self.events.message(f"actor {index} back after {self.calls.now() - slot.since:.1f} s: "
                                    f"{len(self.alive)} of {len(self.slots)} actors alive")
        self.events.actors_changed(len(self.alive), len(self.pending))

    def replace(self, index: int, err: Exception, hung: bool = False) -> None:
        """A lost actor: classify the loss (only crashes spend the budget; ``hung``: one that missed its deadline,
        said already), then a replacement in its slot."""
        loss = self.group.replace(index, err, hung)
        self.events.actor_lost(index, loss.cause, loss.node)
        cause = "" if hung else f" ({type(err).__name__}: {first_line(err)})"
        self.events.message(f"actor {index} {LOSS_WORDS[loss.cause]}{cause}; replacement pending: "
                            f"{len(self.alive)} of {len(self.slots)} actors alive")
        self.events.actors_changed(len(self.alive), len(self.pending))

    def shutdown(self) -> None:
        self.group.shutdown()
