"""What every benchmark shares: its config, its Ray, its actors, its command-line options and the machine.

Light at import (torch, Ray and gymnasium load inside the functions), so ``dppo bench --help`` stays fast.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppo.bench.memory import read_kib
from dppo.errors import UsageError

if TYPE_CHECKING:
    import ray

    from dppo.config import Config
    from dppo.rl.model import ActorCritic
    from dppo.rl.segment import Segment

Row = dict[str, Any]  # one line of a benchmark's table and one object of its --json list
DOCS_FILE = Path("docs/benchmarks.md")


def parse_counts(text: str, name: str = "--actors", minimum: int = 1) -> list[int]:
    """"1,2,4,8" -> [1, 2, 4, 8]."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{name} {text!r} is not a comma-separated list of integers, e.g. 1,2,4,8") from None
    if not values or any(v < minimum for v in values):
        raise UsageError(f"{name} {text!r}: every value must be >= {minimum}, e.g. 1,2,4,8")
    return values


def check_env_id(env_id: str) -> str:
    """``env_id`` if gymnasium knows it (ALE ids need ale-py; dppo's own ``dppo/...`` envs too) or it names an
    importable PettingZoo env module (``mpe2.simple_spread_v3``), else a usage error."""
    import importlib.util

    import gymnasium

    import dppo.envs  # noqa: F401 - registers the dppo/... envs
    from dppo.config.env import PETTINGZOO_MODULE

    if PETTINGZOO_MODULE.fullmatch(env_id):
        try:
            found = importlib.util.find_spec(env_id) is not None
        except ModuleNotFoundError:  # its package is missing
            found = False
        if not found:
            raise UsageError(f"PettingZoo env module {env_id!r} cannot be imported; install its package (pip install "
                             "'dppo[multiagent]')")
        return env_id

    if env_id.startswith("ALE/"):
        from dppo.envs.atari import require_ale

        require_ale()
    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error:
        raise UsageError(f"unknown gymnasium environment {env_id!r}; use a registered id such as CartPole-v1") from None
    return env_id


def bench_config(env_id: str, envs_per_actor: int | None, segment_length: int | None, latency_ms: float,
                 vectorization: str, actors: int = 1, sets: list[str] | None = None) -> Config:
    """The env's preset with the benchmark's overrides (one minibatch: any batch validates)."""
    from dppo.config import load_config

    overrides: dict[str, Any] = {"env.id": env_id, "env.num_envs": envs_per_actor, "ppo.segment_length": segment_length,
                                 "env.latency_ms": latency_ms, "env.vectorization": vectorization,
                                 "run.actors": actors, "ppo.num_minibatches": 1}
    return load_config(overrides=overrides, sets=sets)


@contextmanager
def ray_session(address: str | None, cpus: int) -> Iterator[None]:
    """Join ``address`` or start a local Ray the way ``dppo train`` does; shut it down if we started it."""
    import ray

    from dppo.distributed.cluster import connect_ray

    if ray.is_initialized():
        yield
        return
    config = bench_config("CartPole-v1", None, None, 0.0, "sync", actors=cpus)
    config.run.address = address
    connect_ray(config)
    try:
        yield
    finally:
        ray.shutdown()


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """This process's torch threads set to ``n`` inside the block."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def actor_cpus(count: int) -> float:
    """One CPU per actor when the cluster has them, else an equal share (8 actors on a 4-CPU test cluster)."""
    import ray

    total = float(ray.cluster_resources().get("CPU", 1.0))
    return min(1.0, math.floor(total / count * 100) / 100)


@contextmanager
def sampling_actors(config: Config, count: int) -> Iterator[list[ray.actor.ActorHandle]]:
    """``count`` of dppo's sampling actors, seeded as a run seeds them; killed when the block ends."""
    import ray

    from dppo.distributed.actor import start_actor
    from dppo.rl.sampler import actor_seed

    handles = [start_actor(config, i, actor_seed(config.run.seed, i)) for i in range(count)]
    try:
        yield handles
    finally:
        for handle in handles:
            ray.kill(handle, no_restart=True)


def sample_round(handles: list[ray.actor.ActorHandle], model: ActorCritic, version: int) -> list[Segment]:
    """One round as a run's driver does it: the model's weights broadcast, every actor's Segment gathered."""
    import ray

    from dppo.distributed.broadcast import Broadcast, broadcast_arg
    from dppo.rl.agent import export_weights

    ref = broadcast_arg(Broadcast(export_weights(model), version, None, None))
    return ray.get([h.sample.remote(ref) for h in handles])


def machine() -> dict[str, Any]:
    """The machine and library versions a table was measured with (the docs print it above the table)."""
    import gymnasium
    import numpy
    import ray
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = read_kib("/proc/meminfo", "MemTotal:") / 1024**2
    return {
        "cpu": model, "cpus": os.cpu_count(), "memory_gib": round(mem_gib, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2), "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__,
        "gymnasium": gymnasium.__version__, "numpy": numpy.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# ---- the command line ----------------------------------------------------------------------------------
def add_common_args(parser: argparse.ArgumentParser, address: bool = True) -> None:
    """The options every benchmark takes: where its numbers go and (unless it makes its own) which Ray it uses."""
    parser.add_argument("--json", metavar="FILE", help="write the rows as a JSON list to FILE")
    parser.add_argument("--write-docs", nargs="?", const=str(DOCS_FILE), metavar="FILE",
                        help=f"replace this benchmark's section of FILE (default {DOCS_FILE})")
    if address:
        parser.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    parser.add_argument("--section", help="name of the docs section to replace (default: from the command's options)")


def typed_argv(args: argparse.Namespace) -> list[str]:
    """The command line as typed, for the docs (``dppo bench ...``), less ``--json FILE`` (output only). Another
    entry (a clone's ``python -m benchmarks``) sets ``args.program`` and the arguments it parsed, ``args.typed``."""
    program = getattr(args, "program", ["dppo", "bench"])
    typed = getattr(args, "typed", None)
    if typed is None:
        if "bench" not in sys.argv:  # called in-process (tests): the subcommand at least
            return [*program, args.bench_command]
        typed = sys.argv[sys.argv.index("bench") + 1:]
    kept = []
    skip = False
    for item in typed:
        if skip:
            skip = False
        elif item == "--json":
            skip = True
        elif not item.startswith("--json="):
            kept.append(item)
    return [*program, *kept]
