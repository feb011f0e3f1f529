"""The actor pool: the round of sampling the actors do every iteration, over elastic membership.

A round asks every alive actor (:mod:`dppo.distributed.membership`) for a segment with this iteration's
broadcast and gathers them with ``ray.wait`` as they arrive. An actor that dies mid-round loses that round's
segment: the round goes on with the others, and when the losses leave it short of ``faults.min_actors``
segments, the actors alive once the floor is met again (replacements included) that have not delivered are
asked too. Stragglers past ``faults.sample_timeout_s`` are dropped once enough segments are in (at least
``faults.min_actors`` and ``faults.min_actors_fraction`` of those asked); NaN/Inf data stops the run or is
dropped (``faults.nonfinite_data``). Segments come back in actor order, so a seeded run that loses nothing is
reproducible. An actor whose segment has not come within its deadline (:mod:`dppo.distributed.deadlines`: derived
from the segments' durations so far, or faults.hang_timeout_s) is hung: said, killed and replaced as a crashed one,
once the run's ``upstream`` check (the inference service answers) has passed. With several policies (a policy
map) each call returns one segment per policy, each its own object (``num_returns``), so each policy's remote
learners read only theirs. Every Ray call goes through the membership's ``calls``, so tests drive the pool with
fakes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import ray

from dppo.config import Config
from dppo.distributed.actor import summaries_only
from dppo.distributed.broadcast import Broadcast, PolicyBroadcasts
from dppo.distributed.deadlines import Hangs, Hung
from dppo.distributed.membership import POLL_S, Membership, PoolEvents, Stop
from dppo.distributed.ray_calls import RayCalls
from dppo.envs.failures import EnvFailure, own_frame
from dppo.errors import RunFailure, UsageError, first_line
from dppo.rl.segment import Segment, SegmentSummary


@dataclass
class Round:
    """One sampling round in flight: the broadcast it uses and the pending sample calls (first ref -> actor), with
    each call's refs when it returns several (one per policy)."""

    broadcast: Broadcast | PolicyBroadcasts | ray.ObjectRef  # see broadcast_arg
    pending: dict[ray.ObjectRef, int]
    outputs: dict[ray.ObjectRef, list[ray.ObjectRef]] = field(default_factory=dict)
    sent_at: float = 0.0  # when the calls were made (the calls' clock): their deadline runs from here


@dataclass
class Gathered:
    """A round's usable segments in actor order (each actor's in policy order), and their object refs (remote
    learners read those). With learner processes (run.learners > 1) the driver holds only each segment's summary:
    the learners fetch the segments themselves, so no T x E array crosses into the driver's process."""

    segments: list[Segment | SegmentSummary]
    refs: list[ray.ObjectRef]


REMOTE_FRAME = re.compile(r'File "([^"]+)", line (\d+)')  # a frame of the remote traceback Ray carries as text


def describe_task_error(err: ray.exceptions.RayTaskError) -> str:
    """What raised in an actor, in one line: the exception, its message and where (``ValueError: operands could not
    be broadcast ... (at dppo/rl/sampler.py:312)``), not Ray's wrapper (``ray::Actor.sample() (pid=..., ...)``). The
    place is read from the remote traceback Ray carries as text (the exception crossed processes without its own)."""
    cause = err.cause if isinstance(err.cause, BaseException) else err
    frames = [(name, int(line)) for name, line in REMOTE_FRAME.findall(str(err))]
    return f"{type(cause).__name__}: {first_line(cause)} (at {own_frame(frames)})"


class ActorPool:
    """Dispatch and gather rounds over the run's actors; ``membership`` keeps the actors themselves."""

    def __init__(self, config: Config, events: PoolEvents, should_stop: Callable[[], bool],
                 calls: RayCalls | None = None, hangs: Hangs | None = None) -> None:
        """``calls``: the Ray calls to make (default: the real ones; tests hand in fakes); ``hangs``: the run's (by
        default the pool's own, told to ``events``)."""
        self.config, self.events, self.should_stop = config, events, should_stop
        self.membership = Membership(config, events, should_stop, calls)
        self.calls = self.membership.calls
        self.hangs = hangs or Hangs(config.faults, events, self.calls.now)
        self.deadline = self.hangs.deadline()  # a segment's, from the segments' durations so far
        self.upstream: Callable[[], None] = lambda: None  # before actors are declared hung: what they wait on answers
        self.summaries = summaries_only(config)  # the driver reads summaries, the learners the segments
        self.returns = len(config.policy_names) * (2 if self.summaries else 1)  # per sample call, per policy

    def start(self) -> None:
        """Every actor spawned and ready (see Membership.start): bad input is found before anything is written,
        actors asking a GPU share that no node has included (they would wait for ever)."""
        if self.config.run.actor_gpus > 0 and (short := gpu_shortage(self.config.run.actor_gpus, ray.nodes())):
            raise UsageError(short)
        self.membership.start()

    @property
    def alive(self) -> list[int]:
        return self.membership.alive

    @property
    def pending(self) -> list[int]:
        return self.membership.pending

    def dispatch(self, broadcast: Broadcast | PolicyBroadcasts | ray.ObjectRef) -> Round:
        """Ask every alive actor for a segment sampled with ``broadcast`` (replacements that became ready join;
        below the floor, wait for them first)."""
        self.membership.wait_for(self.membership.floor_met, "to come back")
        return self._ask(self.alive, broadcast)

    def gather(self, round_: Round) -> Gathered:
        """The round's segments as they arrive; a lost actor's segment is lost with it (a replacement is started),
        stragglers past the deadline are dropped. A round that losses left short of faults.min_actors segments
        is topped up by the actors alive that have not delivered, once there are faults.min_actors of them."""
        faults = self.config.faults
        asked = len(round_.pending)
        needed = min(asked, max(faults.min_actors, math.ceil(faults.min_actors_fraction * asked)))
        segments: dict[int, list[tuple[Segment, ray.ObjectRef]]] = {}
        while True:
            lost, cut = self._collect(round_, segments, needed)
            if len(segments) >= faults.min_actors or cut or not lost:
                break
            self.membership.wait_for(self.membership.floor_met, "to come back")
            round_ = self._ask([i for i in self.alive if i not in segments], round_.broadcast)
        if not segments:
            raise RunFailure("no usable segment arrived this iteration; see the messages above")
        ordered = [pair for i in sorted(segments) for pair in segments[i]]  # fixed order: seeded runs reproduce
        return Gathered([s for s, _ in ordered], [r for _, r in ordered])

    def _ask(self, indices: list[int], broadcast: Broadcast | PolicyBroadcasts | ray.ObjectRef) -> Round:
        if self.returns == 1:
            return Round(broadcast, {self.membership.slots[i].handle.sample.remote(broadcast): i for i in indices},
                         sent_at=self.calls.now())
        round_ = Round(broadcast, {}, sent_at=self.calls.now())
        for i in indices:
            refs = self.membership.slots[i].handle.sample.options(num_returns=self.returns).remote(broadcast)
            round_.pending[refs[0]] = i
            round_.outputs[refs[0]] = list(refs)
        return round_

    def _collect(self, round_: Round, segments: dict[int, list[tuple[Segment, ray.ObjectRef]]],
                 needed: int) -> tuple[bool, bool]:
        """Gather one dispatch's calls into ``segments``; (an actor was lost, the deadline cut the round)."""
        timeout_s = self.config.faults.sample_timeout_s
        deadline = None if timeout_s is None else self.calls.now() + timeout_s
        pending, lost = dict(round_.pending), False
        while pending:
            if self.should_stop():
                raise Stop
            now = self.calls.now()
            past = deadline is not None and now >= deadline
            if deadline is None:
                wait_s = POLL_S
            elif past:  # enough in: take what is ready now, then cut; too few: keep waiting, without spinning
                wait_s = 0.0 if len(segments) >= needed else POLL_S
            else:
                wait_s = min(POLL_S, deadline - now)
            ready = self.calls.wait(list(pending), num_returns=1, timeout=wait_s)
            if ready and len(pending) > 1:  # every ref ready by now in one sweep: one poll per arrival is N^2 refs
                ready = self.calls.wait(list(pending), num_returns=len(pending), timeout=0)
            if not ready and past and len(segments) >= needed:
                self._drop_late(pending)
                return lost, True
            arrived = self.calls.now()
            for ref in ready:
                index = pending.pop(ref)
                refs = round_.outputs.get(ref, [ref])
                if self.summaries:  # (summary, segment) per policy: the driver reads the first, learners the second
                    refs, read = refs[1::2], refs[0::2]
                else:
                    read = refs
                try:
                    delivered = [self.calls.get(part) for part in read]
                except ray.exceptions.RayTaskError as err:
                    if isinstance(err.cause, EnvFailure):
                        raise RunFailure(f"actor {index}: {err.cause}", err.cause.details) from err
                    raise RunFailure(f"actor {index}: {describe_task_error(err)}", str(err)) from err
                except ray.exceptions.RayActorError as err:
                    self.membership.replace(index, err)
                    lost = True
                    continue
                self.deadline.observe(arrived - round_.sent_at)
                if all(self._usable(index, segment) for segment in delivered):
                    segments[index] = list(zip(delivered, refs, strict=True))
            lost |= self._hung(round_, pending)
        return lost, False

    def _hung(self, round_: Round, pending: dict[ray.ObjectRef, int]) -> bool:
        """The actors of ``pending`` past their deadline, once ``upstream`` holds (it raises when what they wait on
        hung instead): each said, killed and replaced, its call dropped from ``pending``. Whether any was."""
        waited = self.calls.now() - round_.sent_at
        if not pending or waited <= self.deadline.seconds:
            return False
        self.upstream()
        for ref, index in list(pending.items()):
            self.hangs.declare("actor", f"actor {index}", "sampling a segment (no segment returned)", waited,
                               self.deadline)
            del pending[ref]
            self.membership.replace(index, Hung(f"no segment in {waited:.1f} s"), hung=True)
        return True

    def _usable(self, index: int, segment: Segment | SegmentSummary) -> bool:
        """False for NaN/Inf data when faults.nonfinite_data=drop (counted); RunFailure when it is "error"."""
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

    def shutdown(self) -> None:
        self.membership.shutdown()


def gpu_shortage(share: float, nodes: list[dict]) -> str | None:
    """One line when no alive node of the cluster (``ray.nodes()``) holds an actor's GPU ``share``, else None."""
    most = max((node["Resources"].get("GPU", 0.0) for node in nodes if node["Alive"]), default=0.0)
    if share <= most:
        return None
    return (f"run.actor_gpus={share:g} asks Ray for a GPU share per actor, and no node of the Ray cluster has "
            f"{share:g} GPU{'' if share <= 1 else 's'} (the most on one node: {most:g}); set run.actor_gpus=0 "
            "(the actors' policy on their CPUs) or start the run where a node has one (on an autoscaling cluster, "
            "once a GPU node is up)")
