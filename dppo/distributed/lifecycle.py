"""The life of a group of Ray actors of one kind, shared by every group the driver runs (sampling actors, learners,
the evaluation actor, the inference service): start each (with its own seed), pending until its ``ready()`` call
answers, a loss told apart (its node went away, or its process crashed on a live node), counted by cause, a crash
spent from the group's crash-loop budget, and a replacement in the lost one's slot with a fresh seed.

RLlib's FaultTolerantActorManager is the anchor, without its call fan-out: what a group does with its actors
(sample every round, update in lock-step, evaluate now and then, serve) and its policy on a loss (replace one, all
L together, or one next time without waiting) stay with the group. Every Ray call goes through
:class:`~dppo.distributed.ray_calls.RayCalls`, so tests drive the lifecycle with fakes whose actors fail at random.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from dppo.distributed.ray_calls import RayCalls
from dppo.distributed.restarts import RestartBudget

# Why an actor is lost, and how the run's one-line messages (an actor's, the evaluation actor's) say it. hang: past
# its deadline (dppo.distributed.deadlines), killed.
LOSS_WORDS = {"node": "lost with its node", "crash": "crashed", "hang": "killed (hung)"}
LOSS_CAUSES = tuple(LOSS_WORDS)


@dataclass
class Slot:
    """One slot of the group: the actor in it, and what is known of it."""

    handle: Any  # ray.actor.ActorHandle (a fake in tests)
    seed: int
    starting: ray.ObjectRef | None  # the ready() call of an actor not yet alive (None: alive)
    since: float  # when it started (to say how long a replacement took)
    replacement: bool = False  # it replaces a lost actor
    node: str | None = None  # where it runs, once known


@dataclass(frozen=True)
class Loss:
    """A lost actor: its slot, why (one of LOSS_CAUSES) and the node it ran on (None: unknown)."""

    index: int
    cause: str
    node: str | None


class ActorGroup:
    """The slots of one group: start, ready, lose (classified, counted, a crash spent), replace, shut down.
    ``seed(index, spawn)`` is the seed of the ``spawn``-th actor started in this group (replacements included);
    ``crashes`` is the budget crashes spend (None: the group's owner keeps its own); ``ready_call``: whether a new
    actor is pending until its ``ready()`` answers (False: alive at once, its first call tells)."""

    def __init__(self, calls: RayCalls, seed: Callable[[int, int], int], crashes: RestartBudget | None = None,
                 ready_call: bool = True) -> None:
        self.calls, self.seed, self.crashes, self.ready_call = calls, seed, crashes, ready_call
        self.slots: list[Slot] = []
        self.spawns = 0  # actors started, replacements included: each gets its own seed
        self.losses: Counter[str] = Counter()  # cause -> losses

    @property
    def alive(self) -> list[int]:
        return [i for i, slot in enumerate(self.slots) if slot.starting is None]

    @property
    def pending(self) -> list[int]:
        return [i for i, slot in enumerate(self.slots) if slot.starting is not None]

    @property
    def handles(self) -> list[Any]:
        return [slot.handle for slot in self.slots]

    def start(self, size: int) -> None:
        """``size`` fresh actors (pending until ready when the group has ready calls)."""
        self.slots = [self.spawn(i) for i in range(size)]

    def spawn(self, index: int, replacement: bool = False) -> Slot:
        """A new actor for slot ``index``, with the next seed (it is not put in its slot: replace does that)."""
        seed = self.seed(index, self.spawns)
        self.spawns += 1
        handle = self.calls.start(index, seed)
        starting = handle.ready.remote() if self.ready_call else None
        return Slot(handle, seed, starting, self.calls.now(), replacement)

    def starting(self) -> dict[ray.ObjectRef, int]:
        """The ready() calls of the pending slots' actors, to wait on: ref -> index."""
        return {slot.starting: i for i, slot in enumerate(self.slots) if slot.starting is not None}

    def mark_ready(self, index: int, node: str | None) -> None:
        self.slots[index].starting, self.slots[index].node = None, node

    def lose(self, index: int, err: Exception, hung: bool = False) -> Loss:
        """Slot ``index``'s actor is lost: classify it (``hung``: it missed its deadline, a hang), count it, spend a
        crash from the budget (RunFailure past it: the actor is left for shutdown), kill what is left of it. Its slot
        keeps the dead actor until replaced."""
        slot = self.slots[index]
        node = slot.node or self.calls.placement(slot.handle).node
        loss = Loss(index, "hang" if hung else self.loss_cause(node, err), node)
        self.losses[loss.cause] += 1
        if loss.cause == "crash" and self.crashes is not None:
            self.crashes.spend(err)
        self.calls.kill(slot.handle)
        return loss

    def replace(self, index: int, err: Exception, hung: bool = False) -> Loss:
        """Slot ``index``'s actor lost (see lose) and a fresh actor, with a fresh seed, in its slot."""
        loss = self.lose(index, err, hung)
        self.slots[index] = self.spawn(index, replacement=True)
        return loss

    def loss_cause(self, node: str | None, err: Exception) -> str:
        """"node" when the actor went with its node (preempted, the node dead, or the actor unreachable: its
        node's raylet no longer answers), else "crash" (the process died and its node reported it)."""
        if getattr(err, "preempted", False) or isinstance(err, ray.exceptions.ActorUnavailableError):
            return "node"
        return "node" if node is not None and node not in self.calls.alive_nodes() else "crash"

    def shutdown(self) -> None:
        for slot in self.slots:
            self.calls.kill(slot.handle)
        self.slots = []
