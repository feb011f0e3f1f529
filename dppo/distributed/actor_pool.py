"""The actor pool: the N actors of a run, and the round of sampling they do for every iteration.

The pool spawns the actors (each with its own seed), waits until every one has made its envs, dispatches a
round (one ``sample`` call per actor with this iteration's broadcast) and gathers it with ``ray.wait`` as
segments arrive. A dead actor is replaced in its slot within the restart budget and asked again; stragglers
past ``faults.sample_timeout_s`` are dropped once enough segments are in; NaN/Inf data stops the run or is
dropped (``faults.nonfinite_data``). Segments come back in actor order, so a seeded run is reproducible.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import ray

from dppo.config import Config
from dppo.distributed.actor import start_actor
from dppo.distributed.broadcast import Broadcast
from dppo.distributed.restarts import RestartBudget
from dppo.envs.user_code import EnvLoadError
from dppo.errors import RunFailure
from dppo.rl.sampler import EnvFailure, actor_seed
from dppo.rl.segment import Segment


class Stop(Exception):
    """A stop was requested (SIGTERM/SIGINT) while a round was in flight."""


class PoolEvents(Protocol):
    """What the pool tells the run about its actors (the run's reporting implements it)."""

    def message(self, text: str) -> None: ...

    def actor_restarted(self, index: int) -> None: ...

    def segment_dropped(self, reason: str) -> None: ...


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
    """Spawn, ready, dispatch, gather, deadline and replace for the actors of one run."""

    def __init__(self, config: Config, events: PoolEvents, should_stop: Callable[[], bool]) -> None:
        self.config, self.events, self.should_stop = config, events, should_stop
        self.actors: list[ray.actor.ActorHandle] = []
        self.spawns = 0  # every actor started in this process, replacements included: each gets its own seed
        faults = config.faults
        self.restarts = RestartBudget("actor", faults.max_actor_restarts, faults.restart_window_s)

    def start(self) -> None:
        """Spawn the N actors and wait until each has made its envs, so a user's env that an actor cannot
        import or make stops the run as bad input before anything is written."""
        self.actors = [self._spawn(i) for i in range(self.config.run.actors)]
        for index, actor in enumerate(self.actors):
            try:
                problem = ray.get(actor.ready.remote())
            except ray.exceptions.RayActorError as err:
                self.shutdown()
                raise RunFailure(f"actor {index} failed to start: {str(err).strip().splitlines()[0]}") from err
            if problem is not None:
                self.shutdown()
                raise EnvLoadError(problem)

    def dispatch(self, broadcast: Broadcast | ray.ObjectRef) -> Round:
        """Ask every actor for a segment sampled with ``broadcast``."""
        return Round(broadcast, {actor.sample.remote(broadcast): i for i, actor in enumerate(self.actors)})

    def gather(self, round_: Round) -> Gathered:
        """One segment per actor; dead actors are replaced and asked again; stragglers past the deadline dropped."""
        faults = self.config.faults
        pending = dict(round_.pending)
        segments: dict[int, tuple[Segment, ray.ObjectRef]] = {}
        deadline = None if faults.sample_timeout_s is None else time.monotonic() + faults.sample_timeout_s
        needed = max(1, math.ceil(faults.min_actors_fraction * len(self.actors)))
        while pending:
            if self.should_stop():
                raise Stop
            wait_s = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not ready:
                if deadline is not None and time.monotonic() >= deadline and len(segments) >= needed:
                    self._drop_late(pending)
                    break
                continue
            for ref in ready:
                index = pending.pop(ref)
                try:
                    segment = ray.get(ref)
                except ray.exceptions.RayTaskError as err:
                    cause = err.cause if isinstance(err.cause, EnvFailure) else err
                    raise RunFailure(f"actor {index}: {cause}") from err
                except ray.exceptions.RayActorError as err:
                    self._replace(index, err)
                    pending[self.actors[index].sample.remote(round_.broadcast)] = index
                    continue
                if self._usable(index, segment):
                    segments[index] = (segment, ref)
        if not segments:
            raise RunFailure("no usable segment arrived this iteration; see the messages above")
        ordered = [segments[i] for i in sorted(segments)]  # fixed order: seeded runs are reproducible
        return Gathered([s for s, _ in ordered], [r for _, r in ordered])

    def _usable(self, index: int, segment: Segment) -> bool:
        """False for a segment with NaN/Inf data when faults.nonfinite_data is drop (else the run stops)."""
        if not segment.nonfinite:
            return True
        env = self.config.env.name
        if self.config.faults.nonfinite_data == "error":
            raise RunFailure(f"env {env} (actor {index}) returned NaN/Inf observations or rewards; fix the env or "
                             "set faults.nonfinite_data=drop")
        self.events.segment_dropped("nonfinite")
        self.events.message(f"actor {index}: NaN/Inf in env {env} data; segment dropped")
        return False

    def _drop_late(self, pending: dict[ray.ObjectRef, int]) -> None:
        for index in pending.values():
            self.events.segment_dropped("late")
            self.events.message(f"actor {index}: segment missed the {self.config.faults.sample_timeout_s:g}s "
                                "deadline; dropped")

    def _spawn(self, index: int) -> ray.actor.ActorHandle:
        seed = actor_seed(self.config.run.seed, index, self.spawns)
        self.spawns += 1
        return start_actor(self.config, index, seed)

    def _replace(self, index: int, err: Exception) -> None:
        """A dead actor (killed, OOM, node lost): start a fresh one in its slot, within the restart budget."""
        self.restarts.spend(err)
        why = str(err).strip().splitlines()[0] if str(err).strip() else ""
        self.events.message(f"actor {index} died ({type(err).__name__}: {why}); starting a replacement")
        self.events.actor_restarted(index)
        ray.kill(self.actors[index], no_restart=True)
        self.actors[index] = self._spawn(index)

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
