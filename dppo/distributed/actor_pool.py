"""The actor pool: the N actors of a run, kept elastic, and the round of sampling they do every iteration.

Nodes come and go (preemption, drains, evictions, the autoscaler), so membership is elastic. Each of the N
slots holds an actor that is *alive* (placed, envs made: it samples) or *pending* (a replacement Ray has not
placed or started yet: it gets no calls). A round asks every alive actor for a segment and gathers them with
``ray.wait`` as they arrive. An actor that dies mid-round loses that round's segment: the round goes on with
the others, a replacement is created at once (fresh seed) and joins the first round after it is ready, with
that round's weights. Below ``faults.min_actors`` alive actors the pool waits, and says so, before dispatching.

Deaths are told apart: an actor lost with its node (the node is gone, preempted or unreachable) is a
*node loss*; one whose process died on a live node is a *crash*, and only crashes spend the crash-loop
budget. Stragglers past ``faults.sample_timeout_s`` are dropped once enough segments are in; NaN/Inf data
stops the run or is dropped (``faults.nonfinite_data``). Segments come back in actor order, so a seeded run
that loses nothing is reproducible.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import ray

from dppo.config import Config
from dppo.distributed.actor import start_actor
from dppo.distributed.broadcast import Broadcast
from dppo.distributed.restarts import RestartBudget
from dppo.envs.user_code import EnvLoadError
from dppo.errors import RunFailure, first_line
from dppo.rl.sampler import EnvFailure, actor_seed
from dppo.rl.segment import Segment

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
    replacement: bool = False  # it replaces a lost actor (its return is worth a line in the log)
    node: str | None = None  # where it runs, once alive
    since: float = field(default_factory=time.monotonic)  # when it started (to say how long a replacement took)


@dataclass
class Round:
    """One sampling round in flight: the broadcast it uses and the pending sample calls (ref -> actor)."""

    broadcast: Broadcast | ray.ObjectRef  # see broadcast_arg
    pending: dict[ray.ObjectRef, int]


@dataclass
class Gathered:
    """A round's usable segments in actor order, and their object refs (remote learners read those)."""

    segments: list[Segment]
    refs: list[ray.ObjectRef]


class ActorPool:
    """Spawn, ready, dispatch, gather, deadline, replace and elastic membership for the actors of one run."""

    def __init__(self, config: Config, events: PoolEvents, should_stop: Callable[[], bool]) -> None:
        self.config, self.events, self.should_stop = config, events, should_stop
        self.slots: list[Slot] = []
        self.spawns = 0  # every actor started in this process, replacements included: each gets its own seed
        faults = config.faults
        self.crashes = RestartBudget("actor", faults.max_actor_restarts, faults.restart_window_s)

    # ---- membership --------------------------------------------------------------------------------
    @property
    def alive(self) -> list[int]:
        return [i for i, slot in enumerate(self.slots) if slot.starting is None]

    @property
    def pending(self) -> list[int]:
        return [i for i, slot in enumerate(self.slots) if slot.starting is not None]

    def start(self) -> None:
        """Spawn the N actors and wait until each has made its envs (an env that an actor cannot import or make
        is bad input before anything is written); after faults.actor_start_timeout_s, start with those ready."""
        self.slots = [self._spawn(i) for i in range(self.config.run.actors)]
        deadline = time.monotonic() + self.config.faults.actor_start_timeout_s
        try:
            self._wait_for(lambda: not self.pending or (time.monotonic() >= deadline and self._floor_met()),
                           "to be placed and start")
        except (RunFailure, EnvLoadError):
            self.shutdown()
            raise

    def _floor_met(self) -> bool:
        return len(self.alive) >= self.config.faults.min_actors

    def _wait_for(self, done: Callable[[], bool], what: str) -> None:
        """Poll pending actors until ``done()``, saying every REPORT_EVERY_S what the run waits for."""
        said = time.monotonic()
        self._promote(timeout=0.0)
        while not done():
            if self.should_stop():
                raise Stop
            self._promote(timeout=POLL_S)
            if time.monotonic() - said >= REPORT_EVERY_S and not done():
                said = time.monotonic()
                self.events.message(f"waiting for actors {what}: {len(self.alive)} of {len(self.slots)} alive, "
                                    f"{len(self.pending)} pending (faults.min_actors={self.config.faults.min_actors}); "
                                    "the cluster has no room for them yet")

    def _promote(self, timeout: float) -> None:
        """Pending actors whose ready() answered become alive (or end the run: their env cannot be made)."""
        starting = {slot.starting: i for i, slot in enumerate(self.slots) if slot.starting is not None}
        if not starting:
            return
        ready, _ = ray.wait(list(starting), num_returns=len(starting), timeout=timeout)
        for ref in ready:
            index = starting[ref]
            slot = self.slots[index]
            try:
                problem, slot.node = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                if err.actor_init_failed:  # its constructor raised: the same code fails on any node
                    raise RunFailure(f"actor {index} failed to start: {first_line(err)}") from err
                self._replace(index, err)  # lost before it was ready (its node went away first)
                continue
            if problem is not None:
                raise EnvLoadError(problem)
            slot.starting = None
            if slot.replacement:
                self.events.message(f"actor {index} back after {time.monotonic() - slot.since:.1f} s: "
                                    f"{len(self.alive)} of {len(self.slots)} actors alive")
        self.events.actors_changed(len(self.alive), len(self.pending))

    # ---- a round -----------------------------------------------------------------------------------
    def dispatch(self, broadcast: Broadcast | ray.ObjectRef) -> Round:
        """Ask every alive actor for a segment sampled with ``broadcast`` (replacements that became ready join;
        below the floor, wait for them first)."""
        self._wait_for(self._floor_met, "to come back")
        return Round(broadcast, {self.slots[i].handle.sample.remote(broadcast): i for i in self.alive})

    def gather(self, round_: Round) -> Gathered:
        """The round's segments as they arrive; a lost actor's segment is lost with it (a replacement is started),
        stragglers past the deadline are dropped. A round that lost every actor is dispatched again."""
        faults = self.config.faults
        while True:
            pending = dict(round_.pending)
            alive_before = len(self.alive)
            segments: dict[int, tuple[Segment, ray.ObjectRef]] = {}
            deadline = None if faults.sample_timeout_s is None else time.monotonic() + faults.sample_timeout_s
            needed = max(1, math.ceil(faults.min_actors_fraction * len(pending)))
            while pending:
                if self.should_stop():
                    raise Stop
                wait_s = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
                if not ready:
                    if deadline is not None and time.monotonic() >= deadline and len(segments) >= needed:
                        self._drop_late(pending)
                        break
                    continue
                for ref in ready:
                    index = pending.pop(ref)
                    segment = self._receive(index, ref)
                    if segment is not None:
                        segments[index] = (segment, ref)
            if segments:
                ordered = [segments[i] for i in sorted(segments)]  # fixed order: seeded runs are reproducible
                return Gathered([s for s, _ in ordered], [r for _, r in ordered])
            if len(self.alive) == alive_before:  # nobody was lost: every segment was dropped
                raise RunFailure("no usable segment arrived this iteration; see the messages above")
            round_ = self.dispatch(round_.broadcast)

    def _receive(self, index: int, ref: ray.ObjectRef) -> Segment | None:
        """The segment of a finished sample call, or None: its actor was lost, or its data is NaN/Inf (drop)."""
        try:
            segment = ray.get(ref)
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, EnvFailure):
                raise RunFailure(f"actor {index}: {err.cause}", err.cause.details) from err
            raise RunFailure(f"actor {index}: {first_line(err)}", str(err)) from err
        except ray.exceptions.RayActorError as err:
            self._replace(index, err)
            return None
        if not segment.nonfinite:
            return segment
        env = self.config.env.name
        if self.config.faults.nonfinite_data == "error":
            raise RunFailure(f"env {env} (actor {index}) returned NaN/Inf observations or rewards; fix the env or "
                             "set faults.nonfinite_data=drop")
        self.events.segment_dropped("nonfinite")
        self.events.message(f"actor {index}: NaN/Inf in env {env} data; segment dropped")
        return None

    def _drop_late(self, pending: dict[ray.ObjectRef, int]) -> None:
        for index in pending.values():
            self.events.segment_dropped("late")
            self.events.message(f"actor {index}: segment missed the {self.config.faults.sample_timeout_s:g}s "
                                "deadline; dropped")

    # ---- losses ------------------------------------------------------------------------------------
    def _spawn(self, index: int, replacement: bool = False) -> Slot:
        seed = actor_seed(self.config.run.seed, index, self.spawns)
        self.spawns += 1
        handle = start_actor(self.config, index, seed)
        return Slot(handle, handle.ready.remote(), replacement)

    def _replace(self, index: int, err: ray.exceptions.RayActorError) -> None:
        """A lost actor: classify the loss (only crashes spend the budget), then a replacement in its slot."""
        node = self.slots[index].node or placed_on(self.slots[index].handle)
        cause = self.loss_cause(node, err)
        if cause == "crash":
            self.crashes.spend(err)
        ray.kill(self.slots[index].handle, no_restart=True)
        self.slots[index] = self._spawn(index, replacement=True)
        self.events.actor_lost(index, cause, node)
        what = "lost with its node" if cause == "node" else "crashed"
        self.events.message(f"actor {index} {what} ({type(err).__name__}: {first_line(err)}); replacement pending: "
                            f"{len(self.alive)} of {len(self.slots)} actors alive")
        self.events.actors_changed(len(self.alive), len(self.pending))

    @staticmethod
    def loss_cause(node: str | None, err: ray.exceptions.RayActorError) -> str:
        """"node" when the actor went with its node (preempted, the node dead, or the actor unreachable: its
        node's raylet no longer answers), else "crash" (the process died and its node reported it)."""
        if err.preempted or isinstance(err, ray.exceptions.ActorUnavailableError):
            return "node"
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        return "node" if node is not None and node not in alive else "crash"

    def shutdown(self) -> None:
        for slot in self.slots:
            ray.kill(slot.handle, no_restart=True)
        self.slots = []


def placed_on(handle: ray.actor.ActorHandle) -> str | None:
    """The node an actor was placed on, from the GCS's actor table (for one lost before it reported it)."""
    try:
        return ray._private.state.actors(handle._actor_id.hex())["Address"]["NodeID"] or None
    except (AttributeError, KeyError, TypeError, RuntimeError):  # a private API: without it, the node is unknown
        return None


