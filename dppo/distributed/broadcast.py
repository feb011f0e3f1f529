"""The broadcast: what every actor gets from the driver once per iteration, and how it travels."""

from __future__ import annotations

import dataclasses
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
