"""Learner group: L data-parallel Trainers as Ray actors in one torch.distributed process group.

Each learner holds a model replica and the same optimizer state, gets the iteration's segments by object
reference (the driver never concatenates the batch), builds the batch, and takes every L-th row of each
global minibatch; advantage statistics, gradients and diagnostics are summed over the group (gloo on CPU,
NCCL on GPUs), so every learner takes the same step as one learner would on the whole minibatch. Learner 0
exports the weights the driver broadcasts and checkpoints. The process group's rendezvous address is
learner 0's node IP and a free port, handed out through Ray.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import ray
import torch

from dppo.config import Config
from dppo.errors import UsageError
from dppo.rl.agent import Weights, export_weights
from dppo.rl.model import ActorCritic
from dppo.rl.ppo import Trainer, TrainStats, build_batch


class LearnerDied(RuntimeError):
    """A learner of the group is gone; its replicas can no longer agree."""


class AllReduce:
    """torch.distributed's all-reduce (sum) as the Trainer's reducer."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.seconds = 0.0  # time spent in all-reduce (waiting for peers included), for the metrics

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        tensor = tensor.detach().clone()
        start = time.perf_counter()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        self.seconds += time.perf_counter() - start
        return tensor


class LearnerWorker:
    """One replica: model, Trainer, and its rank in the process group."""

    def __init__(self, config: Config, obs_space: Any, action_space: Any, rank: int, world: int,
                 device: str = "cpu") -> None:
        torch.set_num_threads(config.run.learner_threads)
        self.config, self.rank, self.world = config, rank, world
        self.device = torch.device(device)  # the driver decided (group_device): cuda only with a GPU per rank
        self.model = ActorCritic(obs_space, action_space, config.model)
        self.reducer = AllReduce(world)
        self.trainer = Trainer(self.model, config.ppo, config.num_iterations, config.run.seed, self.device,
                               self.reducer, rank)

    def rendezvous(self) -> str:
        """``tcp://ip:port`` of a free port on this node (learner 0's; the group meets there)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def join(self, address: str) -> None:
        import torch.distributed as dist

        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=address, rank=self.rank, world_size=self.world)

    def load(self, model_state: dict[str, Any], trainer_state: dict[str, Any] | None) -> None:
        self.model.load_state_dict(model_state)
        if trainer_state is not None:
            self.trainer.load_state_dict(trainer_state)

    def update(self, segment_refs: list[ray.ObjectRef], iteration: int) -> tuple[TrainStats, float, float]:
        """The update's statistics, its seconds, and the seconds of those spent in all-reduce."""
        start, self.reducer.seconds = time.perf_counter(), 0.0
        segments = ray.get(segment_refs)  # zero-copy reads from the object store
        batch = build_batch(segments, self.config.ppo.gamma, self.config.ppo.gae_lambda, self.device)
        stats = self.trainer.update(batch, iteration)
        return stats, time.perf_counter() - start, self.reducer.seconds

    def weights(self) -> Weights:
        return export_weights(self.model)

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.model.state_dict(), self.trainer.state_dict()


LearnerActor = ray.remote(LearnerWorker)


def group_device(config: Config) -> str:
    """cuda when the cluster has a GPU for every learner (NCCL wants one GPU per rank; two ranks on one GPU
    fail with "Duplicate GPU detected"), else cpu with gloo. run.device=cuda with too few GPUs is bad input."""
    if config.run.device == "cpu":
        return "cpu"
    learners, gpus = config.run.learners, int(ray.cluster_resources().get("GPU", 0))
    if gpus >= learners:
        return "cuda"
    if config.run.device == "cuda":
        raise UsageError(f"run.device=cuda with run.learners={learners} needs a GPU per learner, but the Ray cluster "
                         f"has {gpus}; lower run.learners to {max(gpus, 1)}, add GPUs (chart value learners.gpus) "
                         "or use run.device=auto (CPU learners when GPUs are short)")
    return "cpu"


class LearnerGroup:
    """The driver's handle on L learners: start, join, load, update, read weights and state."""

    def __init__(self, config: Config, obs_space: Any, action_space: Any, device: str | None = None) -> None:
        self.config, self.obs_space, self.action_space = config, obs_space, action_space
        self.device = device or group_device(config)
        self.actors: list[ray.actor.ActorHandle] = []
        self.timings: list[tuple[float, float]] = []  # per rank: (update s, all-reduce s) of the last update
        self._start()

    def _start(self) -> None:
        world = self.config.run.learners
        gpus = 1 if self.device == "cuda" else 0
        resource = self.config.run.learner_resource
        placement = ({"num_cpus": 0, "resources": {resource: 1}} if resource
                     else {"num_cpus": self.config.run.learner_cpus})
        self.actors = [LearnerActor.options(num_gpus=gpus, **placement).remote(
            self.config, self.obs_space, self.action_space, rank, world, self.device) for rank in range(world)]
        address = ray.get(self.actors[0].rendezvous.remote())
        ray.get([a.join.remote(address) for a in self.actors])

    def restart(self, model_state: dict[str, Any], trainer_state: dict[str, Any] | None) -> None:
        """A learner died: the survivors' process group is broken, so replace all L and load the given state."""
        self.shutdown()
        self._start()
        self.load(model_state, trainer_state)

    def load(self, model_state: dict[str, Any], trainer_state: dict[str, Any] | None) -> None:
        model_ref, trainer_ref = ray.put(model_state), ray.put(trainer_state)  # one copy, read by every learner
        ray.get([a.load.remote(model_ref, trainer_ref) for a in self.actors])

    def update(self, segment_refs: list[ray.ObjectRef], iteration: int) -> TrainStats:
        """Every learner updates; they agree, so learner 0's statistics are the group's. A learner that dies
        stops the iteration (the driver restarts the group)."""
        refs = [a.update.remote(segment_refs, iteration) for a in self.actors]
        pending = list(refs)
        try:
            while pending:  # ray.wait, not ray.get in order: survivors block in the all-reduce of a dead peer
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready)
            results = ray.get(refs)
        except ray.exceptions.RayActorError as err:
            raise LearnerDied(f"a learner process died during the update: {str(err).strip().splitlines()[0]}") from err
        self.timings = [(update_s, reduce_s) for _stats, update_s, reduce_s in results]
        return results[0][0]

    def weights(self) -> Weights:
        try:
            return ray.get(self.actors[0].weights.remote())
        except ray.exceptions.RayActorError as err:
            why = str(err).strip().splitlines()[0]
            raise LearnerDied(f"learner 0 died before exporting its weights: {why}") from err

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return ray.get(self.actors[0].state.remote())

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
