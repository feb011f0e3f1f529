"""The actor pool: the round of sampling the actors do every iteration, over elastic membership.

A round asks every alive actor (:mod:`dppo.distributed.membership`) for a segment with this iteration's
broadcast and gathers them with ``ray.wait`` as they arrive. An actor that dies mid-round loses that round's
segment: the round goes on with the others and its replacement joins the first round after it is ready.
Stragglers past ``faults.sample_timeout_s`` are dropped once enough segments are in; NaN/Inf data stops the
run or is dropped (``faults.nonfinite_data``). Segments come back in actor order, so a seeded run that loses
nothing is reproducible.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import ray

from dppo.config import Config
from dppo.distributed.broadcast import Broadcast
from dppo.distributed.membership import POLL_S, Membership, PoolEvents, Stop
from dppo.errors import RunFailure, first_line
from dppo.rl.sampler import EnvFailure
from dppo.rl.segment import Segment


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
    """Dispatch and gather rounds over the run's actors; ``members`` keeps the actors themselves."""

    def __init__(self, config: Config, events: PoolEvents, should_stop: Callable[[], bool]) -> None:
        self.config, self.events, self.should_stop = config, events, should_stop
        self.members = Membership(config, events, should_stop)

    def start(self) -> None:
        """Every actor spawned and ready (see Membership.start): bad input is found before anything is written."""
        self.members.start()

    @property
    def alive(self) -> list[int]:
        return self.members.alive

    @property
    def pending(self) -> list[int]:
        return self.members.pending

    def dispatch(self, broadcast: Broadcast | ray.ObjectRef) -> Round:
        """Ask every alive actor for a segment sampled with ``broadcast`` (replacements that became ready join;
        below the floor, wait for them first)."""
        self.members.wait_for(self.members.floor_met, "to come back")
        return Round(broadcast, {self.members.slots[i].handle.sample.remote(broadcast): i for i in self.alive})

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
            self.members.replace(index, err)
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

    def shutdown(self) -> None:
        self.members.shutdown()
