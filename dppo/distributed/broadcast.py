"""The broadcast: what every actor gets from the driver once per iteration, and how it travels; and how the
self-play pool's snapshots travel (each once)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import ray

from dppo.rl.agent import Weights
from dppo.rl.normalizer import RunningStats
from dppo.rl.opponents import PoolView

INLINE_LIMIT = 64 * 1024  # bytes of weights and stats sent inside each call; Ray inlines up to 100 KiB


@dataclass
class Broadcast:
    """Weights, their version and the merged normalizer statistics every actor samples with; in self-play, the
    pool of opponents."""

    weights: Weights
    version: int
    obs_stats: RunningStats | None
    return_stats: RunningStats | None
    opponents: PoolView | None = None


def payload_bytes(value: object) -> int:
    """Bytes of the numpy arrays in a Segment, a Broadcast or a weights dict: what crosses processes."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, list):
        return sum(payload_bytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(payload_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0


PolicyBroadcasts = dict[str, Broadcast]  # a run of several policies (a policy map) broadcasts one per policy


def broadcast_arg(broadcast: Broadcast | PolicyBroadcasts) -> Broadcast | PolicyBroadcasts | ray.ObjectRef:
    """What the driver hands every actor's ``sample`` call for this round's broadcast (one policy's, or each
    policy's by name).

    A small broadcast goes by value, inside each call (no object-store round trip for the actor to
    resolve); a large one is put in the object store once and every actor reads that copy. Either way it
    is a copy: exported weights are views of learner 0's parameters (in the driver with run.learners 1), which
    the update changes in place, and a round's broadcast can be sent again after it (to a replaced actor, with
    overlap_sampling).
    """
    if payload_bytes(broadcast) > INLINE_LIMIT:
        return ray.put(broadcast)
    if isinstance(broadcast, dict):
        return {name: copied(part) for name, part in broadcast.items()}
    return copied(broadcast)


def copied(broadcast: Broadcast) -> Broadcast:
    """The broadcast with its own copy of the weights."""
    return dataclasses.replace(broadcast, weights={k: np.array(v) for k, v in broadcast.weights.items()})


class SnapshotRefs:
    """The self-play pool's snapshots in the object store, each put once, when it joins the pool: a round's
    broadcast carries their refs (a pool of 30 Connect Four snapshots is 21 MB, which used to be put again every
    round and, with the inference service, sent inside every actor's call), and an actor fetches only those it
    lacks (:func:`fetch_new_snapshots`). A snapshot the pool drops loses its ref here."""

    def __init__(self) -> None:
        self.refs: dict[int, ray.ObjectRef] = {}

    def view(self, pool: PoolView) -> PoolView:
        """``pool`` with each snapshot's weights replaced by its ref."""
        self.refs = {i: self.refs[i] if i in self.refs else ray.put(w) for i, w in zip(pool.ids, pool.weights,
                                                                                         strict=True)}
        return dataclasses.replace(pool, weights=[self.refs[i] for i in pool.ids])


def fetch_new_snapshots(pool: PoolView, known: Collection[int]) -> PoolView:
    """In an actor: ``pool`` with the weights of the snapshots it does not hold yet (``known``) fetched, in one
    ``ray.get``; the others stay refs, which the actor never reads."""
    missing = [k for k, i in enumerate(pool.ids) if i not in known and isinstance(pool.weights[k], ray.ObjectRef)]
    if not missing:
        return pool
    weights = list(pool.weights)
    for k, fetched in zip(missing, ray.get([weights[k] for k in missing]), strict=True):
        weights[k] = fetched
    return dataclasses.replace(pool, weights=weights)
