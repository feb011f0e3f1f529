"""`dppo bench`: sampling throughput, time to solve, learner update speed and weight broadcast.

Benchmarks are commands that print a table and write numbers (``--json FILE``, ``--write-docs``): they
never assert a time. ``--write-docs`` replaces the command's own section of docs/benchmarks.md, between
markers, with the machine, the exact command, the table and (for solve) the figure.

The measuring functions take an ``address`` so tests can run them on a shared local Ray cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dppo.errors import UsageError

DOCS_FILE = Path("docs/benchmarks.md")
DOCS_TITLE = "# Benchmarks\n\nEvery section below is written by the `dppo bench` command it shows (`--write-docs`).\n"
Row = dict[str, Any]


# ---- process-tree memory (Linux /proc; no psutil needed) ----------------------------------------------
def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def process_tree(roots: list[int]) -> set[int]:
    """The roots and all their descendants (Ray's GCS, raylet and workers descend from the driver)."""
    children = _children_map()
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, []))
    return seen


def _kib(path: str, key: str) -> int:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_memory_mib(roots: list[int]) -> dict[str, float]:
    """Summed RSS (counts shared pages once per process) and PSS (shares them out) over the tree, MiB."""
    pids = process_tree(roots)
    rss = sum(_kib(f"/proc/{p}/status", "VmRSS:") for p in pids)
    pss = sum(_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids)
    return {"processes": len(pids), "rss_mib": round(rss / 1024, 1), "pss_mib": round(pss / 1024, 1)}


class PeakMemory:
    """Samples tree memory in a thread; keeps the peak summed RSS and PSS."""

    def __init__(self, roots: Callable[[], list[int]], every_s: float = 0.5) -> None:
        self.roots, self.every_s = roots, every_s
        self.peak = {"processes": 0, "rss_mib": 0.0, "pss_mib": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            now = tree_memory_mib(self.roots())
            if now["rss_mib"] > self.peak["rss_mib"]:
                self.peak = now

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ---- shared helpers ----------------------------------------------------------------------------------
def parse_counts(text: str, name: str = "--actors", minimum: int = 1) -> list[int]:
    """"1,2,4,8" -> [1, 2, 4, 8]."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{name} {text!r} is not a comma-separated list of integers, e.g. 1,2,4,8") from None
    if not values or any(v < minimum for v in values):
        raise UsageError(f"{name} {text!r}: every value must be >= {minimum}, e.g. 1,2,4,8")
    return values


def bench_config(env_id: str, envs_per_actor: int | None, segment_length: int | None, latency_ms: float,
                 vectorization: str, actors: int = 1, sets: list[str] | None = None):
    """The env's preset with the benchmark's overrides (minibatch 1 so any batch validates)."""
    from dppo.config import load_config

    overrides: dict[str, Any] = {"env.id": env_id, "env.num_envs": envs_per_actor, "ppo.segment_length": segment_length,
                                 "env.latency_ms": latency_ms, "env.vectorization": vectorization,
                                 "run.actors": actors, "ppo.minibatch_size": 1}
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


def machine() -> dict[str, Any]:
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
    mem_gib = _kib("/proc/meminfo", "MemTotal:") / 1024**2
    return {
        "cpu": model, "cpus": os.cpu_count(), "memory_gib": round(mem_gib, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2), "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__,
        "gymnasium": gymnasium.__version__, "numpy": numpy.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# ---- sampling ----------------------------------------------------------------------------------------
def _in_process(config, iterations: int, raw: bool) -> float:
    """Steps/s of one process, no Ray: the Sampler (raw=False) or a plain vector env + torch MLP loop."""
    import torch

    from dppo.envs.make import make_vector_env
    from dppo.rl.model import ActorCritic
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
        model = ActorCritic(envs.single_observation_space, envs.single_action_space, config.model)
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


def _ray_sampling(config, actors: int, iterations: int) -> tuple[float, dict[str, float]]:
    """Steps/s of ``actors`` Ray actors sampling one broadcast per round, and the tree memory meanwhile."""
    import ray

    from dppo.distributed.actor import start_actor
    from dppo.distributed.broadcast import Broadcast, broadcast_arg
    from dppo.envs.make import make_env
    from dppo.rl.agent import export_weights
    from dppo.rl.model import ActorCritic
    from dppo.rl.sampler import actor_seed

    config.run.actors = actors
    config.run.actor_cpus = actor_cpus(actors)
    env = make_env(config.env)
    model = ActorCritic(env.observation_space, env.action_space, config.model)
    env.close()
    handles = [start_actor(config, i, actor_seed(config.run.seed, i)) for i in range(actors)]
    try:
        pids = ray.get([h.pid.remote() for h in handles])
        ref = broadcast_arg(Broadcast(export_weights(model), 0, None, None))
        ray.get([h.sample.remote(ref) for h in handles])  # warm-up: first weights, first segment
        start = time.perf_counter()
        for version in range(1, iterations + 1):
            ref = broadcast_arg(Broadcast(export_weights(model), version, None, None))
            ray.get([h.sample.remote(ref) for h in handles])
        elapsed = time.perf_counter() - start
        memory = tree_memory_mib([os.getpid(), *pids])
    finally:
        for h in handles:
            ray.kill(h, no_restart=True)
    steps = iterations * actors * config.env.num_envs * config.ppo.segment_length
    return steps / elapsed, memory


def sampling_limit(actors: int, envs: int, latency_ms: float, vectorization: str) -> float | None:
    """The latency-bound ceiling: sync steps an actor's envs one after another, async all at once."""
    if latency_ms <= 0:
        return None
    concurrent = envs if vectorization == "async" else 1
    return max(actors, 1) * concurrent * 1000.0 / latency_ms


def bench_sampling(actor_counts: list[int], env_id: str = "CartPole-v1", envs_per_actor: int = 8,
                   segment_length: int | None = None, latency_ms: float = 0.0, iterations: int = 10,
                   vectorization: str = "sync", address: str | None = None, raw_baseline: bool = True) -> list[Row]:
    """Rows: the raw loop and the in-process Sampler (actors 0), then one row per actor count.

    ``efficiency`` is steps/s over the in-process Sampler baseline (the one-core ceiling; it can pass 1
    with more cores or with latency-bound envs); ``of_limit`` is steps/s over the latency-bound ceiling.
    """
    config = bench_config(env_id, envs_per_actor, segment_length, latency_ms, vectorization)
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
        for count in actor_counts:
            steps_per_s, memory = _ray_sampling(config.model_copy(deep=True), count, iterations)
            rows.append(row("ray", count, steps_per_s, **memory))
    for r in rows:
        r["efficiency"] = round(r["steps_per_s"] / baseline, 3)
    return rows


# ---- solve -------------------------------------------------------------------------------------------
def stop_process_tree(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """End a run that overran: SIGTERM first (a learner checkpoints and stops its local Ray), then SIGKILL to
    whatever is left of its process tree, found while the run was alive (a bare SIGKILL of the run leaves
    Ray's dashboard and runtime-env agents running)."""
    import psutil

    def tree() -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return psutil.Process(proc.pid).children(recursive=True)
        return []

    seen = {p.pid: p for p in tree()}
    proc.terminate()
    deadline = time.monotonic() + grace_s
    while proc.returncode is None and time.monotonic() < deadline:
        seen.update({p.pid: p for p in tree()})  # processes started since (Ray's agents, if it was starting)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=0.2)  # reads the pipes, so a chatty run cannot block on them
    if proc.returncode is None:
        proc.kill()
        proc.communicate()
    for child in seen.values():
        with contextlib.suppress(psutil.Error):
            child.kill()  # psutil checks the start time: a reused pid is left alone


def _timed_subprocess(cmd: list[str], timeout_s: float) -> tuple[float, float, PeakMemory]:
    """Run ``cmd`` to its end: wall seconds from launch to exit, the epoch time it ended, its tree's peak memory."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with PeakMemory(lambda: [proc.pid]) as memory:
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_process_tree(proc)
            raise UsageError(f"`{shlex.join(cmd)}` ran past --timeout {timeout_s:g}s; "
                             "raise --timeout (seconds per run)") from None
    wall, ended_at = time.perf_counter() - start, time.time()
    if proc.returncode != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"`{shlex.join(cmd)}` exited {proc.returncode}: {last}")
    return wall, ended_at, memory


def _memory_cells(memory: PeakMemory) -> Row:
    return {"peak_rss_mib": memory.peak["rss_mib"], "peak_pss_mib": memory.peak["pss_mib"],
            "processes": memory.peak["processes"]}


def run_train(argv: list[str], run_dir: Path, timeout_s: float) -> Row:
    """One `dppo train` subprocess: wall time from launch to exit (start-up included) and peak memory."""
    cmd = [sys.executable, "-m", "dppo", "train", *argv, "--run-dir", str(run_dir)]
    wall, ended_at, memory = _timed_subprocess(cmd, timeout_s)
    summary = json.loads((run_dir / "summary.json").read_text())
    phases = summary["startup_s"]
    return {"wall_s": round(wall, 2), "train_s": summary["wall_s"], "startup_s": round(sum(phases.values()), 2),
            "phases": phases, "first_iteration_s": summary["first_iteration_s"],
            "exit_s": round(ended_at - summary["finished_at"], 2),
            "env_steps": summary["env_steps"], "iterations": summary["iterations"], "solved": summary["solved"],
            "episode_return_mean": summary["episode_return_mean"], **_memory_cells(memory), "run_dir": str(run_dir)}


def run_reference(env_id: str, seed: int, envs: int, out_dir: Path, timeout_s: float,
                  sets: list[str] | None = None) -> Row:
    """Stable-Baselines3's PPO on the same preset in one process (dppo.bench.reference), timed as run_train."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise UsageError("--reference needs Stable-Baselines3 in this environment: pip install 'dppo[bench]'") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"reference-seed{seed}.json"
    cmd = [sys.executable, "-m", "dppo.bench.reference", "--env", env_id, "--seed", str(seed), "--envs", str(envs),
           "--out", str(out), *(arg for item in sets or [] for arg in ("--set", item))]
    wall, _ended_at, memory = _timed_subprocess(cmd, timeout_s)
    summary = json.loads(out.read_text())
    return {"wall_s": round(wall, 2), "train_s": summary["train_s"], "startup_s": summary["startup_s"],
            "env_steps": summary["env_steps"], "solved": summary["solved"],
            "episode_return_mean": summary["episode_return_mean"], **_memory_cells(memory)}


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def _solve_row(env_id: str, actors: int | str, runs: list[Row], keys: tuple[str, ...]) -> Row:
    """Median (min-max) over the seeds of each key, the solved count, and the runs themselves."""
    return {"env": env_id, "actors": actors, "repeats": len(runs), "solved": sum(r["solved"] for r in runs),
            **{key: _spread([r[key] for r in runs]) for key in keys}, "runs": runs}


def bench_solve(actor_counts: list[int], env_id: str = "CartPole-v1", repeats: int = 3, seed: int = 1,
                out_dir: Path = Path("runs/bench-solve"), address: str | None = None,
                sets: list[str] | None = None, timeout_s: float = 600.0, reference: bool = False) -> list[Row]:
    """Rows per actor count: wall time (launch to exit) and env steps to the target, median and range. With
    ``reference``, first a row of Stable-Baselines3's single-process PPO on the same preset, overrides and
    seeds, and every row's ``vs_reference`` = its median wall time over the reference's (same run, same machine)."""
    from dppo.config import load_config

    common = ("wall_s", "train_s", "startup_s", "env_steps", "peak_rss_mib", "peak_pss_mib")
    rows = []
    if reference:
        preset = load_config(overrides={"env.id": env_id}, sets=sets)
        envs = preset.run.actors * preset.env.num_envs
        runs = [run_reference(env_id, seed + r, envs, out_dir, timeout_s, sets) for r in range(repeats)]
        rows.append({**_solve_row(env_id, f"SB3 PPO, 1 process, {envs} envs", runs, common), "vs_reference": 1.0})
    for count in actor_counts:
        runs = []
        for r in range(repeats):
            run_dir = out_dir / f"actors{count}-seed{seed + r}"
            if run_dir.exists():
                raise UsageError(f"{run_dir} already exists; pass another --out-dir or remove it")
            argv = ["--env", env_id, "--actors", str(count), "--seed", str(seed + r),
                    *(arg for item in sets or [] for arg in ("--set", item))]
            if address:
                argv += ["--address", address]
            runs.append(run_train(argv, run_dir, timeout_s))
        row = _solve_row(env_id, count, runs, (*common, "exit_s"))
        row["first_iteration_s"] = _spread([r["first_iteration_s"] or 0.0 for r in runs])  # None: no iteration ran
        row["phases"] = {k: round(statistics.median(r["phases"][k] for r in runs), 3) for k in runs[0]["phases"]}
        if reference:
            row["vs_reference"] = round(row["wall_s"]["median"] / rows[0]["wall_s"]["median"], 3)
        rows.append(row)
    return rows


# ---- update and weight broadcast -----------------------------------------------------------------------
class _WeightProbe:
    """An actor that only loads broadcast weights: the sync cost an actor pays per iteration."""

    def __init__(self, config) -> None:
        import torch

        from dppo.envs.make import make_env
        from dppo.rl.agent import Agent

        torch.set_num_threads(1)
        env = make_env(config.env)
        self.agent = Agent(env.observation_space, env.action_space, config.model)
        env.close()

    def load(self, broadcast) -> int:
        self.agent.load(broadcast.weights, broadcast.version)
        return self.agent.version


def _update_row(config, hidden: list[int], actors: int, iterations: int, learner_threads: int,
                device: str = "cpu") -> Row:
    import ray
    import torch

    from dppo.distributed.actor import start_actor
    from dppo.distributed.broadcast import Broadcast, broadcast_arg, payload_bytes
    from dppo.distributed.learner_group import resolve_device
    from dppo.envs.make import make_env
    from dppo.rl.agent import export_weights
    from dppo.rl.model import ActorCritic, num_parameters
    from dppo.rl.ppo import Trainer
    from dppo.rl.sampler import actor_seed

    learner_device = resolve_device(device)
    config.model.hidden_sizes = hidden
    config.run.actors = actors
    config.run.actor_cpus = actor_cpus(actors)
    env = make_env(config.env)
    model = ActorCritic(env.observation_space, env.action_space, config.model)
    env.close()
    trainer = Trainer(model, config.ppo, 1_000_000, config.run.seed, learner_device)
    cpus = config.run.actor_cpus
    probe_cls = ray.remote(num_cpus=cpus)(_WeightProbe)
    probes = [probe_cls.remote(config) for _ in range(actors)]
    try:
        ray.get([p.load.remote(Broadcast(export_weights(model), -2, None, None)) for p in probes])
        broadcast_s = []
        for version in range(iterations):
            start = time.perf_counter()
            ref = broadcast_arg(Broadcast(export_weights(model), version, None, None))
            ray.get([p.load.remote(ref) for p in probes])
            broadcast_s.append(time.perf_counter() - start)
    finally:
        for p in probes:
            ray.kill(p, no_restart=True)
    handles = [start_actor(config, i, actor_seed(config.run.seed, i)) for i in range(actors)]
    try:
        ref = broadcast_arg(Broadcast(export_weights(model), 0, None, None))
        ray.get([h.sample.remote(ref) for h in handles])  # warm-up
        iteration_s, update_s, moved = [], [], []
        reset_peak_rss()
        with torch_threads(learner_threads):
            for version in range(1, iterations + 1):
                start = time.perf_counter()
                ref = broadcast_arg(Broadcast(export_weights(model), version, None, None))
                segments = ray.get([h.sample.remote(ref) for h in handles])
                moved.append(sum(payload_bytes(seg) for seg in segments))
                t_update = time.perf_counter()  # the batch's copy to the device counts as update time
                trainer.train_on(segments, version)
                if learner_device.type == "cuda":
                    torch.cuda.synchronize()
                now = time.perf_counter()
                update_s.append(now - t_update)
                iteration_s.append(now - start)
    finally:
        for h in handles:
            ray.kill(h, no_restart=True)
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
            "learner_peak_rss_mib": round(_kib("/proc/self/status", "VmHWM:") / 1024, 1)}


def reset_peak_rss() -> None:
    """Restart this process's peak-RSS count (VmHWM), so a row reports its own peak (Linux >= 4.0)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


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
            rows.append(_update_row(config, hidden, actors, iterations, learner_threads, device))
    return rows


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
    from dppo.rl.model import ActorCritic, num_parameters
    from dppo.rl.ppo import Trainer
    from dppo.rl.sampler import Sampler

    preset_minibatch = load_config(overrides={"env.id": env_id}).ppo.minibatch_size
    rows: list[Row] = []
    with ray_session(address, max(learner_counts)):
        for hidden in models:
            config = bench_config(env_id, envs_per_actor, segment_length, 0.0, "ale" if env_id.startswith("ALE/")
                                  else "sync", actors=actors)
            config.ppo.minibatch_size = min(minibatch_size or preset_minibatch, config.batch_size)
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
            model = ActorCritic(obs_space, action_space, config.model)

            name = "NatureCNN" if model.encoder is not None else f"MLP {hidden}"
            shape = {"model": name, "parameters": num_parameters(model), "batch": config.batch_size,
                     "minibatch_size": config.ppo.minibatch_size, "epochs": config.ppo.epochs}

            for threads in (1, 2):
                trainer = Trainer(ActorCritic(obs_space, action_space, config.model), config.ppo, 1_000_000,
                                  config.run.seed, torch.device("cpu"))
                seconds = []
                with torch_threads(threads):
                    for i in range(iterations + 1):
                        start = time.perf_counter()
                        trainer.train_on(segments, i)
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
                        group.update(segments, refs, i)
                        seconds.append(time.perf_counter() - start)
                        shares.append(max(r / u for u, r in group.timings))  # the slowest-waiting learner
                finally:
                    group.shutdown()
                rows.append(_learners_row(shape, learners, 1, seconds[1:], statistics.median(shares[1:])))
            config.run.learners = 1
    return rows


# ---- output ------------------------------------------------------------------------------------------
def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict) and {"median", "min", "max"} <= value.keys():
        return f"{_cell(value['median'])} ({_cell(value['min'])}-{_cell(value['max'])})"
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def table(rows: list[Row], columns: list[str]) -> str:
    """A Markdown table (also readable in a terminal)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def section_markers(key: str) -> tuple[str, str]:
    return f"<!-- dppo-bench:{key}:begin -->", f"<!-- dppo-bench:{key}:end -->"


def replace_section(text: str, key: str, body: str) -> str:
    """Put ``body`` between the section's markers, replacing what was there; append a new section."""
    begin, end = section_markers(key)
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text and text.index(begin) < text.index(end):
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return text.rstrip() + "\n\n" + block + "\n"


def write_docs(path: Path, key: str, title: str, note: str, command: str, table_md: str, info: dict[str, Any],
               figure: Path | None = None) -> None:
    import fcntl

    from dppo.run.run_dir import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ", no GPU"
    box = (f"{info['cpu']}, {info['cpus']} CPUs, {info['memory_gib']} GiB{gpu}; {info['os']}; Python {info['python']}, "
           f"torch {info['torch']}, Ray {info['ray']}, gymnasium {info['gymnasium']}, numpy {info['numpy']}; "
           f"load average {info['load_avg_1m']} at the start (the machine is shared); {info['date']}")
    body = [f"## {title}", "", note, "", f"Machine: {box}.", "", "```", command, "```", "", table_md]
    if figure is not None:
        body += ["", f"![{title}]({os.path.relpath(figure, path.parent)})"]
    lock = os.open(path.parent, os.O_RDONLY)  # benchmarks run side by side (bench learn per env): one writer
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = path.read_text() if path.exists() else DOCS_TITLE
        atomic_write(path, replace_section(text, key, "\n".join(body)).encode())
    finally:
        os.close(lock)


def emit(args: argparse.Namespace, rows: list[Row], columns: list[str], key: str, title: str, note: str,
         info: dict[str, Any], figure: Path | None = None) -> None:
    md = table(rows, columns)
    print(md, flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    if args.write_docs:
        command = "dppo " + shlex.join(args.argv)
        write_docs(Path(args.write_docs), key, title, note, command, md, info, figure)
        print(f"wrote section {key!r} of {args.write_docs}", flush=True)


# ---- CLI ---------------------------------------------------------------------------------------------
def _positive(kind: type, name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} {text!r} is not a number") from None
        if value < 0 or (kind is int and value < 1):
            raise argparse.ArgumentTypeError(f"{name} must be {'>= 1' if kind is int else '>= 0'}, got {text}")
        return value
    return parse


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="write the rows as a JSON list to FILE")
    parser.add_argument("--write-docs", nargs="?", const=str(DOCS_FILE), metavar="FILE",
                        help=f"replace this benchmark's section of FILE (default {DOCS_FILE})")
    parser.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    parser.add_argument("--section", help="name of the docs section to replace (default: from the command's options)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `dppo bench sampling|solve|update` to the CLI."""
    bench = subparsers.add_parser("bench", help="benchmarks: sampling throughput, time to solve, update speed",
                                  description=__doc__.splitlines()[0].split(": ", 1)[1])
    sub = bench.add_subparsers(dest="bench_command", required=True, parser_class=type(bench))

    sampling = sub.add_parser("sampling", help="env steps/s per actor count against the in-process baseline")
    sampling.add_argument("--actors", default="1,2,4,8", help="comma-separated actor counts (default 1,2,4,8)")
    sampling.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default CartPole-v1)")
    sampling.add_argument("--envs-per-actor", type=_positive(int, "--envs-per-actor"), default=8,
                          help="E (default 8)")
    sampling.add_argument("--segment-length", type=_positive(int, "--segment-length"),
                          help="T (default: the env preset's)")
    sampling.add_argument("--env-latency-ms", type=_positive(float, "--env-latency-ms"), default=0.0,
                          help="sleep this long in every env step (releases the CPU, like a remote simulator)")
    sampling.add_argument("--vectorization", choices=["sync", "async", "ale"], default="sync",
                          help="sync: an actor's envs stepped one after another; async: one subprocess each")
    sampling.add_argument("--iterations", type=_positive(int, "--iterations"), default=10,
                          help="timed sampling rounds per row, after one warm-up round (default 10)")
    _common(sampling)
    sampling.set_defaults(func=cmd_sampling)

    solve = sub.add_parser("solve", help="wall-clock time and env steps to the target return per actor count")
    solve.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default CartPole-v1)")
    solve.add_argument("--actors", default="1,8", help="comma-separated actor counts (default 1,8)")
    solve.add_argument("--repeats", type=_positive(int, "--repeats"), default=3, help="seeds per actor count")
    solve.add_argument("--seed", type=int, default=1, help="first seed (repeats use seed, seed+1, ...)")
    solve.add_argument("--out-dir", type=Path, help="where the runs go (default runs/bench-solve-<timestamp>)")
    solve.add_argument("--figure", type=Path, help="the return-vs-time figure (default: docs/bench-<section>.png "
                       "with --write-docs, else <out-dir>/solve.png)")
    solve.add_argument("--timeout", type=_positive(float, "--timeout"), default=600.0, help="seconds per run")
    solve.add_argument("--reference", action="store_true",
                       help="also time Stable-Baselines3's single-process PPO on the same preset and seeds "
                       "(pip install 'dppo[bench]')")
    solve.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help="config override passed to every `dppo train` (repeatable)")
    _common(solve)
    solve.set_defaults(func=cmd_solve)

    update = sub.add_parser("update", help="learner update throughput and weight-broadcast time per model size")
    update.add_argument("--hidden-sizes", action="append", metavar="W,W",
                        help="an MLP's hidden widths (repeatable; default 64,64 and 1024,1024 = about 2 M parameters)")
    update.add_argument("--actors", type=_positive(int, "--actors"), default=8, help="actors receiving weights")
    update.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default CartPole-v1)")
    update.add_argument("--envs-per-actor", type=_positive(int, "--envs-per-actor"), default=8, help="E (default 8)")
    update.add_argument("--segment-length", type=_positive(int, "--segment-length"), help="T (default: preset's)")
    update.add_argument("--minibatch-size", type=_positive(int, "--minibatch-size"), help="default: the preset's")
    update.add_argument("--learner-threads", type=_positive(int, "--learner-threads"), default=1,
                        help="torch threads of the update (default 1)")
    update.add_argument("--iterations", type=_positive(int, "--iterations"), default=3,
                        help="timed iterations (default 3)")
    update.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu",
                        help="where the update runs (default cpu; the batch's copy to a GPU is timed with it)")
    update.add_argument("--learners", help="comma-separated learner counts, e.g. 1,2: compare one learner (1 and 2 "
                        "torch threads) with L data-parallel learners of 1 thread on the same batch")
    _common(update)
    update.set_defaults(func=cmd_update)

    from dppo.bench.learn import register_learn
    from dppo.bench.round import register_round

    register_learn(sub)
    register_round(sub)


def _argv(args: argparse.Namespace) -> None:
    """The command line as typed, for the docs (``dppo bench ...``), less ``--json FILE`` (output only)."""
    if "bench" not in sys.argv:  # called in-process (tests): the subcommand at least
        args.argv = ["bench", args.bench_command]
        return
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
    args.argv = ["bench", *kept]


def _env_id(env_id: str) -> str:
    import gymnasium

    if env_id.startswith("ALE/"):
        from dppo.envs.atari import require_ale

        require_ale()
    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error:
        raise UsageError(f"unknown gymnasium environment {env_id!r}; use a registered id such as CartPole-v1") from None
    return env_id


def cmd_sampling(args: argparse.Namespace) -> int:
    _argv(args)
    counts = parse_counts(args.actors)
    info = machine()
    rows = bench_sampling(counts, _env_id(args.env), args.envs_per_actor, args.segment_length, args.env_latency_ms,
                          args.iterations, args.vectorization, args.address)
    latency = args.env_latency_ms
    key = "sampling" + (f"-latency-{latency:g}ms" if latency else "")
    key = args.section or key + (f"-{args.vectorization}" if args.vectorization != "sync" else "")
    if args.env != "CartPole-v1" and not args.section:
        key = f"{key}-{args.env.split('/')[-1]}"
    bound = f"latency-bound ({latency:g} ms per env step, {args.vectorization})" if latency else "CPU-bound"
    note = ("Env steps per second of sampling alone (weights broadcast every round, segments gathered, no "
            "update). actors 0 rows run in this process without Ray: `raw-loop` is a plain gymnasium vector env "
            "with a batched torch MLP, `in-process` is dppo's Sampler and Agent. `efficiency` = steps/s over "
            "the in-process row; `of_limit` = steps/s over the latency ceiling (actors / latency for sync, "
            "actors x E / latency for async). Memory: summed RSS and PSS over the driver's process tree "
            "(Ray's GCS, raylet and workers included) while the actors were alive.")
    columns = ["mode", "actors", "envs_per_actor", "segment_length", "env_latency_ms", "steps_per_s", "efficiency",
               "limit_steps_per_s", "of_limit", "processes", "rss_mib", "pss_mib"]
    shape = f"E = {rows[0]['envs_per_actor']}, T = {rows[0]['segment_length']}"
    emit(args, rows, columns, key, f"Sampling, {args.env}, {bound}, {shape}", note, info)
    return 0


def cmd_solve(args: argparse.Namespace) -> int:
    _argv(args)
    counts = parse_counts(args.actors)
    env_id = _env_id(args.env)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = args.out_dir or Path("runs") / f"bench-solve-{stamp}"
    info = machine()
    rows = bench_solve(counts, env_id, args.repeats, args.seed, out_dir, args.address, args.sets, args.timeout,
                       args.reference)
    ours = rows[1:] if args.reference else rows  # dppo's rows
    key = args.section or f"solve-{env_id}"
    figure = args.figure or (Path(args.write_docs).parent / f"bench-{key}.png" if args.write_docs
                             else out_dir / "solve.png")
    from dppo.commands.plot import plot_runs

    plot_runs([Path(row["runs"][0]["run_dir"]) for row in ours], figure)  # the first seed of each actor count
    print(f"figure: {figure}", flush=True)
    note = ("Each run is a `dppo train` subprocess: `wall_s` is from launch to exit (imports, Ray start-up, "
            "actor start and shutdown included), `train_s` the training loop alone (summary.json). Cells: "
            "median (min-max) over the seeds. Peak memory: summed RSS / PSS over the run's whole process tree "
            "(learner, actors, Ray's own processes), sampled every 0.5 s. The figure shows the first seed of "
            "each actor count.")
    columns = ["actors", "repeats", "solved", "wall_s", "startup_s", "train_s", "first_iteration_s", "exit_s",
               "env_steps", "peak_rss_mib", "peak_pss_mib"]
    phase_names = list(ours[0]["phases"])
    note += ("\n\nStart-up, phase by phase (median seconds; `launch`: interpreter and CLI load until `dppo train` "
             "runs, `config`: config, preset and env check, `ray_init`: the local Ray start or the join, with the "
             "learner built beside it in a helper thread (torch's import, model, optimizer), `learner`: what was "
             "left of that build once Ray was up (with several learners, which need Ray, all of it), "
             "`actors_ready`: spawn every actor and "
             "wait until it has made its envs; then `first_iteration_s` of training, the first weights and "
             "segments, and `exit_s` from summary.json to the process's end):\n\n"
             + table([{"actors": r["actors"], **r["phases"]} for r in ours], ["actors", *phase_names]))
    if args.reference:
        columns.insert(4, "vs_reference")
        note += ("\n\nThe first row is the reference: Stable-Baselines3's PPO in one process with the same preset "
                 "(same envs in all, segment length, epochs, minibatch, learning-rate schedule, gamma, lambda, clip, "
                 "coefficients, network; SB3's own target-KL rule) until the same target over its last 100 "
                 "episodes (dppo/bench_reference.py); `vs_reference` = median wall time over the reference's.")
    actors = " vs ".join(str(c) for c in counts) + (" actor" if counts == [1] else " actors")
    emit(args, rows, columns, key, f"Time to solve {env_id}, {actors}", note, info, figure)
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    _argv(args)
    models = [parse_counts(h, "--hidden-sizes") for h in args.hidden_sizes or ["64,64", "1024,1024"]]
    info = machine()
    if args.learners:
        counts = parse_counts(args.learners, "--learners")
        rows = bench_learners(models, counts, _env_id(args.env), args.actors, args.envs_per_actor,
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
    rows = bench_update(models, args.actors, _env_id(args.env), args.envs_per_actor, args.segment_length,
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
