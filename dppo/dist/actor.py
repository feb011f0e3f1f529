"""The Ray actor: a thin shell that runs a Sampler in its own process."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import ray

from dppo.rl.agent import Weights
from dppo.config import Config
from dppo.rl.normalizer import RunningStats
from dppo.rl.segment import Segment


@dataclass
class Broadcast:
    """What the learner puts in the object store once per iteration; every actor reads the same copy."""

    weights: Weights
    version: int
    obs_stats: RunningStats | None
    return_stats: RunningStats | None


class RolloutWorker:
    """Plain class behind the Ray actor (tests and benchmarks use it directly)."""

    def __init__(self, config: Config, actor_id: int, seed: int) -> None:
        from dppo.rl.sampler import Sampler

        warnings.filterwarnings("ignore", module="gymnasium")
        self.sampler = Sampler(config, actor_id, seed=seed)
        if not self.sampler.agent.fast:  # image policies act with torch; MLP actors never import it
            import torch

            torch.set_num_threads(config.run.torch_threads)
            torch.manual_seed(seed)

    def sample(self, broadcast: Broadcast) -> Segment:
        self.sampler.set_weights(broadcast.weights, broadcast.version, broadcast.obs_stats, broadcast.return_stats)
        return self.sampler.sample()

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


RolloutActor = ray.remote(RolloutWorker)


def start_actor(config: Config, actor_id: int, seed: int) -> ray.actor.ActorHandle:
    """One actor with its CPU reservation; restarts are the learner's job (it resends weights)."""
    return RolloutActor.options(
        num_cpus=config.run.actor_num_cpus, max_restarts=0, name=None,
    ).remote(config, actor_id, seed)
