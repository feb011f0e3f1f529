"""`dppo bench sampling`: env steps per second of sampling alone, per actor count.

It answers whether more actors buy more steps: each Ray row is set against the same sampling in one process
without Ray (the one-core baseline), and for latency-bound envs against the ceiling the latency sets.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

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
from dppo.bench.memory import tree_memory_mib
from dppo.cli_args import fail, positive
from dppo.errors import UsageError

if TYPE_CHECKING:
    from dppo.config import Config


def _in_process(config: Config, iterations: int, raw: bool) -> float:
    """Steps/s of one process, no Ray: the Sampler (raw=False) or a plain vector env + torch MLP loop."""
    import torch

    from dppo.envs.make import make_vector_env
    from dppo.rl.build import build_model
    from dppo.rl.sampler import Sampler

    steps = config.ppo.segment_length
    with torch_threads(1):
        if not raw:
            sampler = Sampler(config)
            sampler.sample()  # warm-up
            start = time.perf_counter()
            for _ in range(iterations):
                sampler.sample()
            elapsed = time.perf_counter() - start
            sampler.close()
            return iterations * steps * config.env.num_envs / elapsed
        envs = make_vector_env(config)
        model = build_model(envs.single_observation_space, envs.single_action_space, config.model)
        obs, _ = envs.reset(seed=config.run.seed)
        start = None
        with torch.inference_mode():
            for t in range((iterations + 1) * steps):
                if t == steps:
                    start = time.perf_counter()
                dist, _value = model(torch.as_tensor(obs, dtype=torch.float32))
                action = dist.sample()
                model.log_prob(dist, action)
                obs, *_ = envs.step(action.numpy())
        elapsed = time.perf_counter() - start
        envs.close()
        return iterations * steps * config.env.num_envs / elapsed


def _ray_sampling(config: Config, actors: int, iterations: int, inference: str = "actor", cpus: float | None = None
                  ) -> tuple[float, dict[str, float]]:
    """Steps/s of ``actors`` Ray actors sampling one broadcast per round, and the tree memory meanwhile;
    ``inference`` server: their policy computed by the inference service (on the GPU when there is one);
    ``cpus``: Ray CPUs (and ale-py threads) per actor (default one, or a share of a smaller cluster)."""
    import ray

    from dppo.envs.make import make_env
    from dppo.rl.build import build_model

    config.run.actors = actors
    config.run.actor_cpus = cpus or actor_cpus(actors)
    config.run.inference = inference
    env = make_env(config.env)
    model = build_model(env.observation_space, env.action_space, config.model)
    env.close()
    with sampling_actors(config, actors) as handles, _served(config, env, inference) as service:
        pids = ray.get([h.pid.remote() for h in handles])
        round_ = sample_round if service is None else service
        round_(handles, model, 0)  # warm-up: first weights, first segment
        start = time.perf_counter()
        for version in range(1, iterations + 1):
            round_(handles, model, version)
        elapsed = time.perf_counter() - start
        memory = tree_memory_mib([os.getpid(), *pids])
    steps = iterations * actors * config.env.num_envs * config.ppo.segment_length
    return steps / elapsed, memory


@contextmanager
def _served(config: Config, env: Any, inference: str) -> Iterator[Callable | None]:
    """With ``inference`` server, a round as the driver runs it then: the weights to the service, the actors sent
    to it; None for the actors' own inference."""
    if inference != "server":
        yield None
        return
    import ray
    import torch

    from dppo.distributed.broadcast import Broadcast
    from dppo.distributed.service_supervisor import ServiceSupervisor
    from dppo.rl.agent import export_weights

    service = ServiceSupervisor(config, env.observation_space, env.action_space,
                        "cuda" if torch.cuda.is_available() else "cpu", print)
    service.start()

    def served_round(handles: list, model: Any, version: int) -> list:
        served = service.serve(Broadcast(export_weights(model), version, None, None))
        return ray.get([h.sample.remote(served) for h in handles])

    try:
        yield served_round
    finally:
        service.shutdown()


def sampling_limit(actors: int, envs: int, latency_ms: float, vectorization: str) -> float | None:
    """The latency-bound ceiling: sync steps an actor's envs one after another, async all at once."""
    if latency_ms <= 0:
        return None
    concurrent = envs if vectorization == "async" else 1
    return max(actors, 1) * concurrent * 1000.0 / latency_ms


def bench_sampling(actor_counts: list[int], env_id: str = "CartPole-v1", envs_per_actor: int = 8,
                   segment_length: int | None = None, latency_ms: float = 0.0, iterations: int = 10,
                   vectorization: str = "sync", address: str | None = None, raw_baseline: bool = True,
                   inference: tuple[str, ...] = ("actor",), actor_halves: int = 1,
                   cpus_per_actor: float | None = None, actor_gpus: float = 0.0) -> list[Row]:
    """Rows: the raw loop and the in-process Sampler (actors 0), then one row per actor count.

    ``efficiency`` is steps/s over the in-process Sampler baseline (the one-core ceiling; it can pass 1
    with more cores or with latency-bound envs); ``of_limit`` is steps/s over the latency-bound ceiling.
    """
    config = bench_config(env_id, envs_per_actor, segment_length, latency_ms, vectorization)
    config.run.actor_halves = actor_halves  # the actors' own policy in two halves (run.actor_halves)
    config.run.actor_gpus = actor_gpus  # ... or on a GPU share of their own (run.actor_gpus)
    base_iterations = iterations if latency_ms <= 0 else max(1, iterations // 2)
    rows: list[Row] = []

    def row(mode: str, actors: int, steps_per_s: float, **extra: Any) -> Row:
        limit = sampling_limit(actors, config.env.num_envs, latency_ms, vectorization)
        return {"mode": mode, "actors": actors, "envs_per_actor": config.env.num_envs,
                "segment_length": config.ppo.segment_length, "env_latency_ms": latency_ms,
                "vectorization": vectorization, "steps_per_s": round(steps_per_s, 1),
                "limit_steps_per_s": limit, "of_limit": None if limit is None else round(steps_per_s / limit, 3),
                **extra}

    if raw_baseline:
        rows.append(row("raw-loop", 0, _in_process(config, base_iterations, raw=True)))
    baseline = _in_process(config, base_iterations, raw=False)
    rows.append(row("in-process", 0, baseline))
    with ray_session(address, max(actor_counts)):
        import ray

        from dppo.distributed.actor_pool import gpu_shortage

        if actor_gpus and (short := gpu_shortage(actor_gpus, ray.nodes())):
            raise UsageError(f"--actor-gpus {actor_gpus:g}: {short.split('; ')[0]}; run it where a node has one "
                             "(or without --actor-gpus)")
        for count in actor_counts:
            for mode in inference:
                steps_per_s, memory = _ray_sampling(config.model_copy(deep=True), count, iterations, mode,
                                                    cpus_per_actor)
                rows.append(row("ray", count, steps_per_s, inference=mode, **memory))
    for r in rows:
        r["efficiency"] = round(r["steps_per_s"] / baseline, 3)
    return rows


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dppo bench sampling`."""
    sampling = sub.add_parser("sampling", help="env steps/s per actor count against the in-process baseline")
    sampling.add_argument("--actors", default="1,2,4,8", help="comma-separated actor counts (default 1,2,4,8)")
    sampling.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default CartPole-v1)")
    sampling.add_argument("--envs-per-actor", type=positive(int, "--envs-per-actor"), default=8,
                          help="E (default 8)")
    sampling.add_argument("--segment-length", type=positive(int, "--segment-length"),
                          help="T (default: the env preset's)")
    sampling.add_argument("--env-latency-ms", type=positive(float, "--env-latency-ms"), default=0.0,
                          help="sleep this long in every env step (releases the CPU, like a remote simulator)")
    sampling.add_argument("--vectorization", choices=["sync", "async", "ale"], default="sync",
                          help="sync: an actor's envs stepped one after another; async: one subprocess each")
    sampling.add_argument("--iterations", type=positive(int, "--iterations"), default=10,
                          help="timed sampling rounds per row, after one warm-up round (default 10)")
    sampling.add_argument("--inference", default="actor",
                          help="comma-separated: actor (each actor's own forward pass), server (the inference "
                               "service batching every actor's; run.inference) (default actor)")
    sampling.add_argument("--actor-halves", type=int, choices=[1, 2], default=1,
                          help="run.actor_halves of the actors running their own policy: 2 steps one half of their "
                               "envs while the other's forward pass runs (default 1)")
    sampling.add_argument("--actor-gpus", type=positive(float, "--actor-gpus"), default=0.0,
                          help="run.actor_gpus: each actor's own policy on a share of a GPU (cuda), computed on a "
                               "worker thread; with --actor-halves 2 one half steps meanwhile (default 0: on its CPU)")
    sampling.add_argument("--actor-cpus", type=positive(float, "--actor-cpus"),
                          help="run.actor_cpus: Ray CPUs per actor, also ale-py's threads (default 1 per actor)")
    add_common_args(sampling)
    sampling.set_defaults(func=cmd_sampling)


def cmd_sampling(args: argparse.Namespace) -> int:
    counts = parse_counts(args.actors)
    modes = tuple(m.strip() for m in args.inference.split(","))
    if not modes or any(m not in ("actor", "server") for m in modes):
        fail(f"--inference takes actor and/or server, comma-separated, not {args.inference!r}")
    if "server" in modes and args.envs_per_actor > 1 and args.envs_per_actor % 2:
        fail(f"--inference server steps each actor's envs in two halves: --envs-per-actor must be even or 1, "
             f"not {args.envs_per_actor}")
    if args.actor_gpus and "server" in modes:
        fail("--actor-gpus puts each actor's own policy on a GPU share, and --inference server computes it in the "
             "service: measure them in two calls (--inference actor --actor-gpus F, then --inference server)")
    if args.actor_gpus and not args.address:
        import torch

        if not torch.cuda.is_available():
            fail(f"--actor-gpus {args.actor_gpus:g} puts each actor's policy on a GPU share, and this machine's torch "
                 "sees no CUDA device: run it on a GPU machine (or a cluster's, with --address)")
    if args.actor_halves == 2 and (args.envs_per_actor % 2 or "server" in modes):
        fail(f"--actor-halves 2 splits the envs of actors running their own policy: it needs an even "
             f"--envs-per-actor (not {args.envs_per_actor}) and --inference actor")
    info = machine()
    rows = bench_sampling(counts, check_env_id(args.env), args.envs_per_actor, args.segment_length,
                          args.env_latency_ms, args.iterations, args.vectorization, args.address, inference=modes,
                          actor_halves=args.actor_halves, cpus_per_actor=args.actor_cpus, actor_gpus=args.actor_gpus)
    latency = args.env_latency_ms
    key = "sampling" + (f"-latency-{latency:g}ms" if latency else "")
    key = args.section or key + (f"-{args.vectorization}" if args.vectorization != "sync" else "")
    if args.env != "CartPole-v1" and not args.section:
        key = f"{key}-{args.env.split('/')[-1]}"
    if modes != ("actor",) and not args.section:
        key = f"{key}-inference"
    bound = f"latency-bound ({latency:g} ms per env step, {args.vectorization})" if latency else "CPU-bound"
    note = ("Env steps per second of sampling alone (weights broadcast every round, segments gathered, no "
            "update). actors 0 rows run in this process without Ray: `raw-loop` is a plain gymnasium vector env "
            "with a batched torch MLP, `in-process` is dppo's Sampler and Agent. `efficiency` = steps/s over "
            "the in-process row; `of_limit` = steps/s over the latency ceiling (actors / latency for sync, "
            "actors x E / latency for async). Memory: summed RSS and PSS over the driver's process tree "
            "(Ray's GCS, raylet and workers included) while the actors were alive. `inference` server: the actors' "
            "policy computed by dppo's inference service (run.inference), on the GPU when there is one, reached "
            "through shared memory by the actors on its node (`dppo bench transport`), by Ray calls from others. "
            "`--actor-gpus F`: each actor's own policy on F of a GPU (run.actor_gpus), on a worker thread.")
    served = ["inference"] if modes != ("actor",) else []
    columns = ["mode", *served, "actors", "envs_per_actor", "segment_length", "env_latency_ms", "steps_per_s",
               "efficiency", "limit_steps_per_s", "of_limit", "processes", "rss_mib", "pss_mib"]
    shape = f"E = {rows[0]['envs_per_actor']}, T = {rows[0]['segment_length']}"
    if args.actor_halves != 1 or args.actor_cpus or args.actor_gpus:  # the actor that steps many envs (issue 42)
        shape += f", {args.actor_halves} halves, {args.actor_cpus or 1:g} CPUs per actor"
        key = args.section or f"{key}-E{args.envs_per_actor}-halves{args.actor_halves}-cpus{args.actor_cpus or 1:g}"
        if args.actor_gpus:
            shape += f", {args.actor_gpus:g} GPU per actor"
            key = args.section or f"{key}-gpus{args.actor_gpus:g}"
    emit(args, rows, columns, key, f"Sampling, {args.env}, {bound}, {shape}", note, info)
    return 0
