"""A learner: the process that updates. One model replica and its Trainer, with its rank in the group.

With ``run.learners: 1`` the one learner is a plain object in the driver; with L > 1 each is a Ray actor
in one torch.distributed process group (gloo on CPU, NCCL on GPUs), whose rendezvous address is learner 0's
node IP and a free port, handed out through Ray.
"""

from __future__ import annotations

import time
from typing import Any

import ray
import torch

from dppo.config import Config
from dppo.distributed.ports import free_ports
from dppo.distributed.ray_calls import per_round
from dppo.envs.user_code import add_import_paths
from dppo.rl.agent import Weights, export_weights
from dppo.rl.build import build_model
from dppo.rl.model import ActorCritic
from dppo.rl.ppo import Trainer, TrainStats
from dppo.rl.segment import Segment


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


class Learner:
    """One replica: model, Trainer, and its rank. ``model`` is the driver's own (L = 1); else one is built."""

    def __init__(self, config: Config, obs_space: Any, action_space: Any, rank: int = 0, world: int = 1,
                 device: str = "cpu", model: ActorCritic | None = None, import_paths: list[str] | None = None) -> None:
        torch.set_num_threads(config.run.learner_threads)
        add_import_paths(import_paths or [])  # a network of one's own (model.entry_point) is imported here
        self.config, self.rank, self.world = config, rank, world
        self.device = torch.device(device)
        self.model = model if model is not None else build_model(obs_space, action_space, config.model)
        self.reducer = AllReduce(world) if world > 1 else None
        self.trainer = Trainer(self.model, config.ppo, config.num_iterations, config.run.seed, self.device,
                               self.reducer, rank)

    def rendezvous(self) -> str:
        """``tcp://ip:port`` of a free port on this node (learner 0's; the group meets there)."""
        (port,) = free_ports(1)  # below the ephemeral range: no connection takes it before the group binds it
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def join(self, address: str) -> None:
        import torch.distributed as dist

        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=address, rank=self.rank, world_size=self.world)

    def load(self, model_state: dict[str, Any] | None, trainer_state: dict[str, Any] | None) -> None:
        if model_state is not None:
            self.model.load_state_dict(model_state)
        if trainer_state is not None:
            self.trainer.load_state_dict(trainer_state)

    @per_round
    def update(self, lr_clock: float, version: int, *segments: Segment) -> tuple[TrainStats, float, float]:
        """The statistics of the update that makes policy ``version``, its seconds, and the seconds of those spent
        in all-reduce. Segments are separate arguments so that Ray resolves each one (zero-copy from the object
        store) for a remote learner."""
        start = time.perf_counter()
        if self.reducer is not None:
            self.reducer.seconds = 0.0
        stats = self.trainer.train_on(list(segments), lr_clock, version)
        reduce_s = self.reducer.seconds if self.reducer is not None else 0.0
        return stats, time.perf_counter() - start, reduce_s

    @per_round
    def weights(self) -> Weights:
        return export_weights(self.model)

    @per_round
    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Model and trainer state on the CPU (a driver without a GPU can hold it, and checkpoints load anywhere)."""
        return on_cpu(self.model.state_dict()), on_cpu(self.trainer.state_dict())


def on_cpu(value: Any) -> Any:
    """A state dict (nested dicts and lists of tensors) with every tensor on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: on_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [on_cpu(v) for v in value]
    return value


RemoteLearner = ray.remote(Learner)
