"""`dppo bench update --learners`: data-parallel learners against one learner with more threads.

Several learners only pay off if L processes of one thread each beat one process given the same cores as
threads; this times one PPO update of the same batch both ways (the target: 2 x 1 thread >= 0.9 x 1 x 2).
"""

from __future__ import annotations

import argparse
import statistics
import time

from dppo.bench.common import (
    Row,
    actor_cpus,
    bench_config,
    check_env_id,
    machine,
    parse_counts,
    ray_session,
    torch_threads,
)
from dppo.bench.docs import emit


def _learners_row(shape: Row, learners: int, threads: int, seconds: list[float],
                  allreduce_share: float | None = None) -> Row:
    update = statistics.median(seconds)
    return {**shape, "learners": learners, "threads_per_learner": threads, "update_s": round(update, 4),
            "samples_per_s": round(shape["batch"] / update, 1),
            "allreduce_share": None if allreduce_share is None else round(allreduce_share, 3)}


def bench_learners(models: list[list[int]], learner_counts: list[int], env_id: str = "CartPole-v1", actors: int = 8,
                   envs_per_actor: int = 8, segment_length: int | None = None, minibatch_size: int | None = None,
                   iterations: int = 3, address: str | None = None) -> list[Row]:
    """Update throughput of one batch: one learner in this process with 1 and 2 torch threads, and L
    data-parallel learners (Ray actors, 1 thread each, gloo all-reduce). Same batch, same minibatches."""
    import ray
    import torch

    from dppo.config import load_config
    from dppo.distributed.learner_group import LearnerGroup
    from dppo.envs.make import env_spaces
    from dppo.rl.build import build_model
    from dppo.rl.model import num_parameters
    from dppo.rl.ppo import Trainer
    from dppo.rl.sampler import Sampler

    preset_minibatch = load_config(overrides={"env.id": env_id}).ppo.minibatch_size
    rows: list[Row] = []
    with ray_session(address, max(learner_counts)):
        for hidden in models:
            config = bench_config(env_id, envs_per_actor, segment_length, 0.0, "ale" if env_id.startswith("ALE/")
                                  else "sync", actors=actors)
            config.ppo.minibatch_size = min(minibatch_size or preset_minibatch, config.batch_size)
            config.ppo.num_minibatches = None  # the size is the rule here (bench_config's one minibatch is not)
            config.model.hidden_sizes = hidden
            config.ppo.target_kl = None  # every row runs all epochs
            config.run.device = "cpu"  # rows compare CPU threads with CPU processes
            obs_space, action_space = env_spaces(config)
            with torch_threads(1):
                segments = []
                for i in range(actors):
                    sampler = Sampler(config, actor_id=i)
                    segments.append(sampler.sample())
                    sampler.close()
            refs = [ray.put(seg) for seg in segments]
            model = build_model(obs_space, action_space, config.model)

            kind = model.encoder.kind if model.encoder is not None else None
            name = {"nature": "NatureCNN", None: f"MLP {hidden}"}.get(kind, f"{kind} image encoder")
            shape = {"model": name, "parameters": num_parameters(model), "batch": config.batch_size,
                     "minibatch_size": config.ppo.minibatch_size, "epochs": config.ppo.epochs}

            for threads in (1, 2):
                trainer = Trainer(build_model(obs_space, action_space, config.model), config.ppo, 1_000_000,
                                  config.run.seed, torch.device("cpu"))
                seconds = []
                with torch_threads(threads):
                    for i in range(iterations + 1):
                        start = time.perf_counter()
                        trainer.train_on(segments, i, i + 1)
                        seconds.append(time.perf_counter() - start)
                rows.append(_learners_row(shape, 1, threads, seconds[1:]))  # the first update warms up
            for learners in (n for n in learner_counts if n > 1):
                config.run.learners, config.run.learner_threads = learners, 1
                config.run.learner_cpus = actor_cpus(learners)
                group = LearnerGroup(config, obs_space, action_space, model)
                try:
                    seconds, shares = [], []
                    for i in range(iterations + 1):
                        start = time.perf_counter()
                        group.update(segments, refs, i, i + 1)
                        seconds.append(time.perf_counter() - start)
                        shares.append(max(r / u for u, r in group.timings))  # the slowest-waiting learner
                finally:
                    group.shutdown()
                rows.append(_learners_row(shape, learners, 1, seconds[1:], statistics.median(shares[1:])))
            config.run.learners = 1
    return rows


def cmd_learners(args: argparse.Namespace, models: list[list[int]]) -> int:
    """`dppo bench update --learners L,L`, on the models `dppo bench update` parsed."""
    info = machine()
    counts = parse_counts(args.learners, "--learners")
    rows = bench_learners(models, counts, check_env_id(args.env), args.actors, args.envs_per_actor,
                          args.segment_length, args.minibatch_size, args.iterations, args.address)
    note = ("One PPO update (all epochs) of the same batch: `learners` 1 runs in this process with "
            "`threads_per_learner` torch threads; more learners are Ray actors with 1 thread each in a "
            "torch.distributed gloo group (each takes its share of every minibatch; gradients, advantage "
            "statistics and diagnostics all-reduced), segments read by reference. `samples_per_s` = batch / "
            "update_s (median). `allreduce_share`: the part of the update a learner spends in all-reduce, "
            "waiting for its peer included (median over updates of the largest learner's share). The target: "
            "2 learners x 1 thread >= 0.9 x 1 learner x 2 threads.")
    columns = ["model", "parameters", "learners", "threads_per_learner", "batch", "minibatch_size", "epochs",
               "update_s", "samples_per_s", "allreduce_share"]
    key = args.section or f"update-learners-{args.env.split('/')[-1]}"
    emit(args, rows, columns, key, f"Data-parallel learners, {args.env}", note, info)
    return 0
