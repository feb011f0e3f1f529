"""`dppo bench update`: the learner's PPO update throughput and the weight broadcast, per model size.

The learner is the one process that cannot be multiplied by adding actors; this says how long its update
takes and what share of an iteration handing the weights to the actors costs as the model grows. With
``--learners`` the same subcommand compares data-parallel learners instead (:mod:`dppo.bench.learners`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING

from dppo.bench.common import (
    Row,
    actor_cpus,
    add_common_args,
    bench_config,
    check_env_id,
    machine,
    parse_counts,
    ray_session,
    sample_round,
    sampling_actors,
    torch_threads,
)
from dppo.bench.docs import emit
from dppo.bench.learners import cmd_learners
from dppo.bench.memory import peak_rss_mib, reset_peak_rss
from dppo.cli_args import positive

if TYPE_CHECKING:
    from dppo.config import Config
    from dppo.distributed.broadcast import Broadcast
    from dppo.rl.model import ActorCritic


class _WeightProbe:
    """An actor that only loads broadcast weights: the sync cost an actor pays per iteration."""

    def __init__(self, config: Config) -> None:
        import torch

        from dppo.envs.make import make_env
        from dppo.rl.agent import Agent

        torch.set_num_threads(1)
        env = make_env(config.env)
        self.agent = Agent(env.observation_space, env.action_space, config.model)
        env.close()

    def load(self, broadcast: Broadcast) -> int:
        self.agent.load(broadcast.weights, broadcast.version)
        return self.agent.version


def _broadcast_seconds(config: Config, model: ActorCritic, actors: int, iterations: int) -> list[float]:
    """Per iteration: the weights handed over (``broadcast_arg``) and loaded by every one of ``actors`` probes."""
    import ray

    from dppo.distributed.broadcast import Broadcast, broadcast_arg
    from dppo.rl.agent import export_weights

    probe_cls = ray.remote(num_cpus=config.run.actor_cpus)(_WeightProbe)
    probes = [probe_cls.remote(config) for _ in range(actors)]
    try:
        ray.get([p.load.remote(Broadcast(export_weights(model), -2, None, None)) for p in probes])
        seconds = []
        for version in range(iterations):
            start = time.perf_counter()
            ref = broadcast_arg(Broadcast(export_weights(model), version, None, None))
            ray.get([p.load.remote(ref) for p in probes])
            seconds.append(time.perf_counter() - start)
        return seconds
    finally:
        for p in probes:
            ray.kill(p, no_restart=True)


def _update_row(config: Config, hidden: list[int], actors: int, iterations: int, learner_threads: int,
                device: str = "cpu") -> Row:
    import torch

    from dppo.distributed.broadcast import payload_bytes
    from dppo.distributed.learner_group import resolve_device
    from dppo.envs.make import make_env
    from dppo.rl.agent import export_weights
    from dppo.rl.build import build_model
    from dppo.rl.model import num_parameters
    from dppo.rl.ppo import Trainer

    learner_device = resolve_device(device)
    config.model.hidden_sizes = hidden
    config.run.actors = actors
    config.run.actor_cpus = actor_cpus(actors)
    env = make_env(config.env)
    model = build_model(env.observation_space, env.action_space, config.model)
    env.close()
    trainer = Trainer(model, config.ppo, 1_000_000, config.run.seed, learner_device)
    broadcast_s = _broadcast_seconds(config, model, actors, iterations)
    with sampling_actors(config, actors) as handles:
        sample_round(handles, model, 0)  # warm-up
        iteration_s, update_s, moved = [], [], []
        reset_peak_rss()
        with torch_threads(learner_threads):
            for version in range(1, iterations + 1):
                start = time.perf_counter()
                segments = sample_round(handles, model, version)
                moved.append(sum(payload_bytes(seg) for seg in segments))
                t_update = time.perf_counter()  # the batch's copy to the device counts as update time
                trainer.train_on(segments, version, version)
                if learner_device.type == "cuda":
                    torch.cuda.synchronize()
                now = time.perf_counter()
                update_s.append(now - t_update)
                iteration_s.append(now - start)
    batch_size = config.batch_size
    update, broadcast, iteration = (statistics.median(v) for v in (update_s, broadcast_s, iteration_s))
    return {"hidden_sizes": hidden, "parameters": num_parameters(model), "actors": actors,
            "device": learner_device.type, "learner_threads": learner_threads, "batch": batch_size,
            "epochs": config.ppo.epochs, "minibatch_size": config.ppo.minibatch_size,
            "update_s": round(update, 4), "samples_per_s": round(batch_size / update, 1),
            "sgd_samples_per_s": round(batch_size * config.ppo.epochs / update, 1),
            "broadcast_s": round(broadcast, 4), "iteration_s": round(iteration, 4),
            "broadcast_fraction": round(broadcast / iteration, 4),
            "segments_mib": round(statistics.median(moved) / 2**20, 2),
            "broadcast_mib": round(actors * payload_bytes(export_weights(model)) / 2**20, 2),
            "learner_peak_rss_mib": peak_rss_mib()}


def bench_update(models: list[list[int]], actors: int = 8, env_id: str = "CartPole-v1", envs_per_actor: int = 8,
                 segment_length: int | None = None, minibatch_size: int | None = None, iterations: int = 3,
                 learner_threads: int = 1, address: str | None = None, device: str = "cpu") -> list[Row]:
    """Per model size: PPO update throughput on the learner (on ``device``: cpu, cuda or auto), and weight
    broadcast time against a whole iteration (put + sample + gather + update) with ``actors`` actors."""
    from dppo.config import load_config

    preset_minibatch = load_config(overrides={"env.id": env_id}).ppo.minibatch_size
    rows = []
    with ray_session(address, actors):
        for hidden in models:
            config = bench_config(env_id, envs_per_actor, segment_length, 0.0, "sync", actors=actors)
            config.ppo.minibatch_size = min(minibatch_size or preset_minibatch, config.batch_size)
            config.ppo.num_minibatches = None  # the size is the rule here (bench_config's one minibatch is not)
            rows.append(_update_row(config, hidden, actors, iterations, learner_threads, device))
    return rows


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dppo bench update` (and its ``--learners`` variant)."""
    update = sub.add_parser("update", help="learner update throughput and weight-broadcast time per model size")
    update.add_argument("--hidden-sizes", action="append", metavar="W,W",
                        help="an MLP's hidden widths (repeatable; default 64,64 and 1024,1024 = about 2 M parameters)")
    update.add_argument("--actors", type=positive(int, "--actors"), default=8, help="actors receiving weights")
    update.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default CartPole-v1)")
    update.add_argument("--envs-per-actor", type=positive(int, "--envs-per-actor"), default=8, help="E (default 8)")
    update.add_argument("--segment-length", type=positive(int, "--segment-length"), help="T (default: preset's)")
    update.add_argument("--minibatch-size", type=positive(int, "--minibatch-size"), help="default: the preset's")
    update.add_argument("--learner-threads", type=positive(int, "--learner-threads"), default=1,
                        help="torch threads of the update (default 1)")
    update.add_argument("--iterations", type=positive(int, "--iterations"), default=3,
                        help="timed iterations (default 3)")
    update.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu",
                        help="where the update runs (default cpu; the batch's copy to a GPU is timed with it)")
    update.add_argument("--learners", help="comma-separated learner counts, e.g. 1,2: compare one learner (1 and 2 "
                        "torch threads) with L data-parallel learners of 1 thread on the same batch")
    add_common_args(update)
    update.set_defaults(func=cmd_update)


def cmd_update(args: argparse.Namespace) -> int:
    models = [parse_counts(h, "--hidden-sizes") for h in args.hidden_sizes or ["64,64", "1024,1024"]]
    if args.learners:
        return cmd_learners(args, models)
    info = machine()
    rows = bench_update(models, args.actors, check_env_id(args.env), args.envs_per_actor, args.segment_length,
                        args.minibatch_size, args.iterations, args.learner_threads, args.address, args.device)
    note = ("`samples_per_s`: batch size over the time of one PPO update (all epochs); `sgd_samples_per_s` "
            "counts every epoch's pass. `broadcast_s`: handing the weights over (`broadcast_arg`: inside each "
            "call when small, else one `ray.put`) plus every actor loading them (median); `iteration_s`: "
            "broadcast + sample + gather + update with this many actors; "
            "`broadcast_fraction` = broadcast_s / iteration_s. Data path: `segments_mib` is what the actors' "
            "segments hold per iteration (read zero-copy from the object store), `broadcast_mib` the weights "
            "every actor reads, `learner_peak_rss_mib` the learner process's peak RSS over the timed iterations.")
    columns = ["hidden_sizes", "parameters", "actors", "device", "learner_threads", "batch", "update_s",
               "samples_per_s", "sgd_samples_per_s", "broadcast_s", "iteration_s", "broadcast_fraction", "segments_mib",
               "broadcast_mib", "learner_peak_rss_mib"]
    emit(args, rows, columns, args.section or "update", "Learner update and weight broadcast", note, info)
    return 0
