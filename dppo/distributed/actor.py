"""The Ray actor: a thin shell that runs a Sampler in its own process."""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass

import numpy as np
import ray

from dppo.config import Config
from dppo.envs.make import add_import_paths, driver_import_paths
from dppo.errors import UsageError
from dppo.rl.agent import Weights
from dppo.rl.normalizer import RunningStats
from dppo.rl.segment import Segment

INLINE_LIMIT = 64 * 1024  # bytes of weights and stats sent inside each call; Ray inlines up to 100 KiB


@dataclass
class Broadcast:
    """What every actor gets from the learner once per iteration: weights and normalizer statistics."""

    weights: Weights
    version: int
    obs_stats: RunningStats | None
    return_stats: RunningStats | None


def payload_bytes(value: object) -> int:
    """Bytes of the numpy arrays in a Segment, a Broadcast or a weights dict: what crosses processes."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(payload_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0


def broadcast_arg(broadcast: Broadcast) -> Broadcast | ray.ObjectRef:
    """What the learner hands every actor's ``sample`` call for this round's broadcast.

    A small broadcast goes by value, inside each call (no object-store round trip for the actor to
    resolve); a large one is put in the object store once and every actor reads that copy. Either way it
    is a copy: exported weights are views of the learner's parameters, which the update changes in place,
    and a round's broadcast can be sent again after it (to a replaced actor, with overlap_sampling).
    """
    if payload_bytes(broadcast) <= INLINE_LIMIT:
        return dataclasses.replace(broadcast, weights={k: np.array(v) for k, v in broadcast.weights.items()})
    return ray.put(broadcast)


class RolloutWorker:
    """Plain class behind the Ray actor (tests and benchmarks use it directly)."""

    def __init__(self, config: Config, actor_id: int, seed: int, import_paths: list[str] | None = None) -> None:
        from dppo.rl.sampler import Sampler

        warnings.filterwarnings("ignore", module="gymnasium")
        add_import_paths(import_paths or [])
        self.actor_id = actor_id
        self.problem: str | None = None
        try:
            self.sampler = Sampler(config, actor_id, seed=seed)
        except UsageError as err:  # the user's env cannot be imported or made here: reported by ready()
            where = f"actor {actor_id} on node {ray.util.get_node_ip_address()}"
            self.problem = f"{str(err).splitlines()[0]} [{where}]"
            return
        if not self.sampler.agent.fast:  # image policies act with torch; MLP actors never import it
            import torch

            torch.set_num_threads(config.run.torch_threads)
            torch.manual_seed(seed)

    def sample(self, broadcast: Broadcast) -> Segment:
        self.sampler.set_weights(broadcast.weights, broadcast.version, broadcast.obs_stats, broadcast.return_stats)
        return self.sampler.sample()

    def ready(self) -> str | None:
        """None once the envs are made; else the one-line reason this actor cannot sample."""
        return self.problem

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


RolloutActor = ray.remote(RolloutWorker)


def start_actor(config: Config, actor_id: int, seed: int) -> ray.actor.ActorHandle:
    """One actor with its CPU reservation; restarts are the learner's job (it resends weights)."""
    return RolloutActor.options(
        num_cpus=config.run.actor_num_cpus, max_restarts=0, name=None,
    ).remote(config, actor_id, seed, driver_import_paths())
