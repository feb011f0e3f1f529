"""Learner: starts the actors, broadcasts weights, gathers segments, trains, checkpoints and reports.

``Learner.run`` is the whole PPO iteration on one page; the helpers below it each do one thing
(gather with failure handling, bookkeeping, checkpoint state).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from dppo.config import Config
from dppo.distributed.actor import Broadcast, broadcast_arg, start_actor
from dppo.distributed.learner_group import LearnerDied, LearnerGroup, group_device
from dppo.envs.make import EnvLoadError, env_spaces
from dppo.errors import UsageError
from dppo.rl.agent import export_weights
from dppo.rl.model import ActorCritic
from dppo.rl.normalizer import RunningStats
from dppo.rl.ppo import Trainer, TrainStats, build_batch
from dppo.rl.sampler import EnvFailure
from dppo.rl.segment import Segment
from dppo.run.checkpoint import CheckpointError, CheckpointStore, atomic_write
from dppo.run.logs import IterationLog
from dppo.run.metrics import Metrics
from dppo.run.tensorboard import TensorBoardLog

log = logging.getLogger(__name__)
RETURN_WINDOW = 100


class RunFailure(RuntimeError):
    """The run cannot go on (crash-looping actors, a persistently failing env, NaN data or updates)."""


class Stop(Exception):
    """SIGTERM/SIGINT arrived: finish with a checkpoint."""


class RestartBudget:
    """At most ``limit`` restarts within a sliding window of ``window_s`` seconds: a crash loop ends the run."""

    def __init__(self, what: str, limit: int, window_s: float) -> None:
        self.what, self.limit, self.window_s = what, limit, window_s  # what: "actor" or "learner"
        self.times: deque[float] = deque()

    def spend(self, err: Exception) -> None:
        """Count one restart now; RunFailure when the window holds more than the limit."""
        now = time.monotonic()
        self.times.append(now)
        while self.times and now - self.times[0] > self.window_s:
            self.times.popleft()
        if len(self.times) > self.limit:
            raise RunFailure(f"{len(self.times)} {self.what} restarts within {self.window_s:g}s exceeds "
                             f"faults.max_{self.what}_restarts={self.limit}; last: {err}")


@dataclass
class Counters:
    """Everything that must continue unchanged after a resume."""

    iteration: int = 0
    env_steps: int = 0
    episodes: int = 0
    wall_s: float = 0.0
    policy_version: int = 0
    bad_updates_in_row: int = 0


@dataclass
class Round:
    """One sampling round in flight: the broadcast it uses and the pending sample calls (ref -> actor)."""

    broadcast: Broadcast | ray.ObjectRef  # see broadcast_arg
    pending: dict[ray.ObjectRef, int]


def resolve_device(device: str) -> torch.device:
    """The learner's device: ``auto`` is the GPU when this process sees one; actors always stay on CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("run.device=cuda but the learner sees no CUDA device; use run.device=auto or cpu, "
                         "or give the head a GPU (chart value head.gpus)")
    return torch.device(device)


def sanitize(record: dict[str, Any]) -> dict[str, Any]:
    """NaN/Inf become null so every line is strict JSON."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


class Learner:
    """The master of a run: owns the model, the Trainer, the actors, the run directory and the metrics."""

    def __init__(self, config: Config, run_dir: Path, resume_state: dict[str, Any] | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.name = config.run.name or run_dir.name
        torch.manual_seed(config.run.seed)
        torch.set_num_threads(config.run.learner_threads)
        np.random.seed(config.run.seed)
        # With run.learners > 1 the group trains (its device decided, bad input refused, before anything is
        # written) and the driver only holds the weights it broadcasts, on the CPU.
        self.learner_device = group_device(config) if config.run.learners > 1 else None
        self.device = resolve_device(config.run.device) if self.learner_device is None else torch.device("cpu")
        self.obs_space, self.action_space = env_spaces(config)
        self.model = ActorCritic(self.obs_space, self.action_space, config.model)
        self.trainer = Trainer(self.model, config.ppo, config.num_iterations, config.run.seed, self.device)
        vector_dim = self.model.obs_spec.vector_dim
        self.obs_stats = RunningStats.empty((vector_dim,)) if config.env.normalize_obs and vector_dim else None
        self.return_stats = RunningStats.empty() if config.env.normalize_reward else None
        self.counters = Counters()
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.recent_lengths: deque[int] = deque(maxlen=RETURN_WINDOW)
        self.store = CheckpointStore(run_dir / "checkpoints", config.run.keep_checkpoints)
        self.metrics = Metrics(config.env.name, self.name)
        self.actors: list[ray.actor.ActorHandle] = []
        faults = config.faults
        self.actor_restart_budget = RestartBudget("actor", faults.max_actor_restarts, faults.restart_window_s)
        self.learner_restart_budget = RestartBudget("learner", faults.max_learner_restarts, faults.restart_window_s)
        self.faults = {"actor_restarts": 0, "learner_restarts": 0, "segments_dropped": 0,
                       "updates_skipped": 0}  # this process only
        self.actor_spawns = 0
        self.stop_signal: int | None = None
        self.tensorboard: TensorBoardLog | None = None  # opened by run(): nothing is written before
        self.group: LearnerGroup | None = None  # run.learners > 1: the update runs there
        self.first_iteration_s: float | None = None
        self.startup_s: dict[str, float] = {}  # start-up phases (set by `dppo train`), into summary.json
        self.segment_refs: list[ray.ObjectRef] = []  # the last gathered segments, in order
        if resume_state is not None:
            self.restore(resume_state)
        self.output = IterationLog(config.run.log_format, config.run.total_steps, log_file=run_dir / "train.log")

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train until total_steps, target_return or time_limit_s; returns the summary written to summary.json."""
        cfg = self.config
        self._install_signal_handlers()
        if cfg.metrics.port:
            port = self.metrics.serve(cfg.metrics.port, cfg.metrics.host)
            self.output.message(f"metrics on http://{cfg.metrics.host}:{port}/metrics")
        if not self.actors:
            self.start_actors()
        if cfg.run.learners > 1:
            self.group = LearnerGroup(cfg, self.obs_space, self.action_space, self.learner_device)
            self.group.load(self.model.state_dict(), self.trainer.state_dict())
        if cfg.run.tensorboard:
            resumed = self.counters.iteration > 0
            self.tensorboard = TensorBoardLog(self.run_dir / "tensorboard", cfg.to_yaml(),
                                              self.counters.env_steps if resumed else None)
        self.metrics.actors_desired.set(cfg.run.actors)
        self.metrics.init_actors(cfg.run.actors)
        self.metrics.actors_alive.set(len(self.actors))
        reason, started = None, time.perf_counter() - self.counters.wall_s
        ahead: Round | None = None  # with run.overlap_sampling: the round already sampling during the update
        try:
            while (reason := self._finished()) is None:
                t0 = time.perf_counter()
                ref = broadcast_arg(self._broadcast())  # weights + normalizer stats, once per iteration
                t1 = time.perf_counter()
                segments = self._gather(ahead or self._dispatch(ref))  # ray.wait; failed actors replaced
                ahead = self._dispatch(ref) if cfg.run.overlap_sampling else None
                t2 = time.perf_counter()
                stats = self._update(segments)
                self._check_update(stats.skipped_minibatches)
                t3 = time.perf_counter()
                sample_s = max(s.sample_seconds for s in segments)
                phases = {"sync": t1 - t0, "sample": sample_s, "wait": max(0.0, t2 - t1 - sample_s),
                          "update": t3 - t2}
                record = self._account(segments, stats.as_dict(), phases, t0, started)
                checkpoint_due = self.counters.iteration % cfg.run.checkpoint_every == 0
                record["checkpoint_s"] = phases["checkpoint"] = self._checkpoint() if checkpoint_due else 0.0
                self._report(record, [r for s in segments for r in s.episode_returns.tolist()], phases)
        except Stop:
            reason = "signal"
        except (RunFailure, EnvFailure, LearnerDied) as err:
            self._checkpoint()
            self._write_summary("error", started)
            raise RunFailure(str(err)) from err
        self._checkpoint()
        summary = self._write_summary(reason, started)
        self.output.close()
        return summary

    def start_actors(self) -> None:
        """Spawn the N actors and wait until each has made its envs, so a user's env that an actor
        cannot import or make stops the run as bad input before anything is written."""
        self.actors = [self._spawn(i) for i in range(self.config.run.actors)]
        for index, actor in enumerate(self.actors):
            try:
                problem = ray.get(actor.ready.remote())
            except ray.exceptions.RayActorError as err:
                self.shutdown()
                raise RunFailure(f"actor {index} failed to start: {str(err).strip().splitlines()[0]}") from err
            if problem is not None:
                self.shutdown()
                raise EnvLoadError(problem)

    def _update(self, segments: list[Segment]) -> TrainStats:
        """The PPO update: here, or on the learner group (segments by reference; weights copied back)."""
        if self.group is None:
            start = time.perf_counter()
            batch = build_batch(segments, self.config.ppo.gamma, self.config.ppo.gae_lambda, self.device)
            stats = self.trainer.update(batch, self.counters.iteration)
            self.metrics.learner_update_seconds.labels(learner="0").observe(time.perf_counter() - start)
            self.metrics.learner_allreduce_seconds.labels(learner="0").observe(0.0)  # one learner: no all-reduce
            return stats
        while True:
            try:
                stats = self.group.update(self.segment_refs, self.counters.iteration)
                self.model.load_state_dict({k: torch.tensor(v) for k, v in self.group.weights().items()})
                for rank, (update_s, reduce_s) in enumerate(self.group.timings):
                    self.metrics.learner_update_seconds.labels(learner=str(rank)).observe(update_s)
                    self.metrics.learner_allreduce_seconds.labels(learner=str(rank)).observe(reduce_s)
                return stats
            except LearnerDied as err:
                self._restart_learners(err)

    def _restart_learners(self, err: LearnerDied) -> None:
        """Replace the whole group (its process group is broken) within the restart budget, then retry the
        iteration on the same segments: weights from the driver's copy of the last update (what a surviving
        learner holds), optimizer state from the last checkpoint (the driver's own before the first)."""
        self.learner_restart_budget.spend(err)
        self.output.message(f"{err}; restarting the {self.config.run.learners} learners")
        intact = self.store.newest_intact()
        trainer_state = intact[1]["trainer"] if intact is not None else self.trainer.state_dict()
        assert self.group is not None
        self.group.restart(self.model.state_dict(), trainer_state)
        self.metrics.learner_restarts.inc()
        self.faults["learner_restarts"] += 1

    # ---- phases --------------------------------------------------------------------------------
    def _broadcast(self) -> Broadcast:
        return Broadcast(export_weights(self.model), self.counters.policy_version, self.obs_stats, self.return_stats)

    def _dispatch(self, ref: Broadcast | ray.ObjectRef) -> Round:
        """Ask every actor for a segment sampled with the broadcast in ``ref``."""
        return Round(ref, {self.actors[i].sample.remote(ref): i for i in range(len(self.actors))})

    def _gather(self, round_: Round) -> list[Segment]:
        """Collect one segment per actor; replace dead actors and resample; drop stragglers past the deadline."""
        cfg = self.config
        ref, pending = round_.broadcast, dict(round_.pending)
        segments: dict[int, Segment] = {}
        refs: dict[int, ray.ObjectRef] = {}
        timeout = cfg.faults.sample_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        needed = max(1, math.ceil(cfg.faults.min_actors_fraction * len(self.actors)))
        while pending:
            if self.stop_signal is not None:
                raise Stop
            wait_s = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not ready:
                if deadline is not None and time.monotonic() >= deadline and len(segments) >= needed:
                    for late in pending.values():
                        self._drop("late")
                        self.output.message(f"actor {late}: segment missed the {timeout:g}s deadline; dropped")
                    break
                continue
            for done_ref in ready:
                index = pending.pop(done_ref)
                try:
                    segment = ray.get(done_ref)
                except ray.exceptions.RayTaskError as err:
                    cause = err.cause if isinstance(err.cause, EnvFailure) else err
                    raise RunFailure(f"actor {index}: {cause}") from err
                except ray.exceptions.RayActorError as err:
                    self._replace(index, err)
                    pending[self.actors[index].sample.remote(ref)] = index
                    continue
                if segment.nonfinite:
                    if cfg.faults.nonfinite_data == "error":
                        raise RunFailure(f"env {cfg.env.name} (actor {index}) returned NaN/Inf observations or "
                                         "rewards; fix the env or set faults.nonfinite_data=drop")
                    self._drop("nonfinite")
                    self.output.message(f"actor {index}: NaN/Inf in env {cfg.env.name} data; segment dropped")
                    continue
                segments[index] = segment
                refs[index] = done_ref
        if not segments:
            raise RunFailure("no usable segment arrived this iteration; see the messages above")
        self.segment_refs = [refs[i] for i in sorted(segments)]
        return [segments[i] for i in sorted(segments)]  # fixed order: seeded runs are reproducible

    def _drop(self, reason: str) -> None:
        self.metrics.segments_dropped.labels(reason=reason).inc()
        self.faults["segments_dropped"] += 1

    def _spawn(self, index: int) -> ray.actor.ActorHandle:
        seed = self.config.run.seed + 10_000 * index + 7_919 * self.actor_spawns
        self.actor_spawns += 1
        return start_actor(self.config, index, seed)

    def _replace(self, index: int, err: Exception) -> None:
        """A dead actor (killed, OOM, node lost): start a fresh one in its slot, within the restart budget."""
        self.actor_restart_budget.spend(err)
        why = str(err).strip().splitlines()[0] if str(err).strip() else ""
        self.output.message(f"actor {index} died ({type(err).__name__}: {why}); starting a replacement")
        self.metrics.actor_restarts.labels(actor=str(index)).inc()
        self.faults["actor_restarts"] += 1
        ray.kill(self.actors[index], no_restart=True)
        self.actors[index] = self._spawn(index)

    def _check_update(self, skipped_minibatches: int) -> None:
        if skipped_minibatches == 0:
            self.counters.bad_updates_in_row = 0
            return
        self.metrics.updates_skipped.inc()
        self.faults["updates_skipped"] += 1
        self.counters.bad_updates_in_row += 1
        limit = self.config.faults.max_nonfinite_updates
        self.output.message(f"update had {skipped_minibatches} NaN/Inf minibatches (skipped); "
                            f"{self.counters.bad_updates_in_row} in a row")
        if self.counters.bad_updates_in_row >= limit:
            raise RunFailure(f"{limit} updates in a row had NaN/Inf losses or gradients; lower "
                             "ppo.learning_rate or check the env's rewards")

    # ---- bookkeeping ---------------------------------------------------------------------------
    def _account(self, segments: list[Segment], stats: dict[str, float], phases: dict[str, float],
                 iteration_start: float, started: float) -> dict[str, Any]:
        """Advance counters, merge normalizer statistics, build the progress record."""
        c = self.counters
        steps = sum(s.num_steps for s in segments)
        returns = np.concatenate([s.episode_returns for s in segments])
        lengths = np.concatenate([s.episode_lengths for s in segments])
        self._merge_stats(segments)
        self.recent_returns.extend(returns.tolist())
        self.recent_lengths.extend(lengths.tolist())
        if self.first_iteration_s is None:  # this process's first round: first weights, first segments
            self.first_iteration_s = round(time.perf_counter() - iteration_start, 3)
        c.iteration += 1
        c.env_steps += steps
        c.episodes += len(returns)
        c.policy_version += 1
        now = time.perf_counter()
        c.wall_s = now - started
        iteration_s = now - iteration_start
        record: dict[str, Any] = {
            "iteration": c.iteration, "env_steps": c.env_steps, "wall_s": round(c.wall_s, 3),
            "episodes": c.episodes, "episode_return_mean": self.return_mean(),
            "episode_length_mean": float(np.mean(self.recent_lengths)) if self.recent_lengths else None,
            "steps_per_s": steps / iteration_s, "env_steps_delta": steps, "iteration_s": iteration_s,
            "policy_version": c.policy_version, "segments": len(segments),
            "policy_lag": max(c.policy_version - 1 - s.policy_version for s in segments),
            **{k: v for k, v in stats.items() if k not in {"epochs_run", "skipped_minibatches"}},
            **{f"{k}_s": v for k, v in phases.items()},
        }
        for seg in segments:
            self.metrics.record_actor(seg.actor_id, seg.sample_seconds)
        return record

    def _merge_stats(self, segments: list[Segment]) -> None:
        for seg in segments:
            if self.obs_stats is not None and seg.obs_stats is not None:
                self.obs_stats = self.obs_stats.merge(seg.obs_stats)
            if self.return_stats is not None and seg.return_stats is not None:
                self.return_stats = self.return_stats.merge(seg.return_stats)

    def _report(self, record: dict[str, Any], new_returns: list[float], phases: dict[str, float]) -> None:
        """The same record goes to progress.jsonl, the metrics and stdout, so they always agree."""
        record = sanitize(record)
        with open(self.run_dir / "progress.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
        self.metrics.record_iteration(record, new_returns, phases)
        if self.tensorboard is not None:
            self.tensorboard.record(record)
        self.output.iteration(record)

    def return_mean(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def _finished(self) -> str | None:
        target = self.config.run.target_return
        mean = self.return_mean()
        if target is not None and mean is not None and len(self.recent_returns) >= RETURN_WINDOW and mean >= target:
            return "target_return"
        if self.counters.env_steps >= self.config.run.total_steps:
            return "total_steps"
        limit = self.config.run.time_limit_s
        if limit is not None and self.counters.wall_s >= limit:
            return "time_limit"
        if self.stop_signal is not None:
            return "signal"
        return None

    def _write_summary(self, reason: str, started: float) -> dict[str, Any]:
        c = self.counters
        summary = sanitize({
            "solved": reason == "target_return", "reason": reason, "wall_s": round(time.perf_counter() - started, 3),
            "env_steps": c.env_steps, "iterations": c.iteration, "episodes": c.episodes,
            "episode_return_mean": self.return_mean(), "target_return": self.config.run.target_return,
            "run": self.name, "env": self.config.env.name,
            "actor_restarts": self.faults["actor_restarts"], "learner_restarts": self.faults["learner_restarts"],
            "segments_dropped": self.faults["segments_dropped"],
            "updates_skipped": self.faults["updates_skipped"],
            "startup_s": self.startup_s, "first_iteration_s": self.first_iteration_s,
            "finished_at": time.time(),  # epoch seconds: what follows (shutdown, exit) is the process's end
        })
        atomic_write(self.run_dir / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
        return summary

    # ---- checkpoints ---------------------------------------------------------------------------
    def _checkpoint(self) -> float:
        start = time.perf_counter()
        existing = self.store.list()
        if existing and existing[-1].name == f"ckpt-{self.counters.iteration:08d}.pt":
            return 0.0  # this iteration is already on disk
        path = self.store.save(self.state(), self.counters.iteration)
        self.metrics.checkpoints.inc()
        self.metrics.checkpoint_bytes.set(path.stat().st_size)
        return time.perf_counter() - start

    def state(self) -> dict[str, Any]:
        """Everything a resume needs, in types that ``torch.load(weights_only=True)`` accepts."""
        return {
            "format": 1, "env_id": self.config.env.name, "config": self.config.model_dump(mode="json"),
            "model": self.model.state_dict(),
            "trainer": self._trainer_state(),
            "obs_stats": self.obs_stats.to_state() if self.obs_stats else None,
            "return_stats": self.return_stats.to_state() if self.return_stats else None,
            "counters": vars(self.counters).copy(),
            "recent_returns": list(self.recent_returns), "recent_lengths": list(self.recent_lengths),
        }

    def _trainer_state(self) -> dict[str, Any]:
        """Optimizer and sampling-order state: learner 0's with a learner group (the driver's if it died)."""
        if self.group is not None:
            try:
                return self.group.state()[1]
            except ray.exceptions.RayActorError:
                self.output.message("learner 0 is gone: the checkpoint keeps the driver's optimizer state")
        return self.trainer.state_dict()

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("env_id") != self.config.env.name:
            raise CheckpointError(f"checkpoint is for env {state.get('env_id')!r}, the config says "
                                  f"{self.config.env.name!r}; resume with the run's own config")
        try:
            self.model.load_state_dict(state["model"])
            self.trainer.load_state_dict(state["trainer"])
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(f"checkpoint does not fit this model ({str(err).splitlines()[0]}); "
                                  "resume with the run's own config") from None
        if state["obs_stats"] is not None:
            self.obs_stats = RunningStats.from_state(state["obs_stats"])
        if state["return_stats"] is not None:
            self.return_stats = RunningStats.from_state(state["return_stats"])
        self.counters = Counters(**state["counters"])
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state["recent_lengths"])
        self.metrics.env_steps.inc(self.counters.env_steps)
        self.metrics.episodes.inc(self.counters.episodes)
        self._truncate_progress()

    def _truncate_progress(self) -> None:
        """Drop progress lines written after the checkpoint we resume from, so iterations stay monotonic."""
        path = self.run_dir / "progress.jsonl"
        if not path.exists():
            return
        kept = []
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["iteration"] <= self.counters.iteration:
                    kept.append(line + "\n")
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut short by a kill
        atomic_write(path, "".join(kept).encode())

    # ---- signals -------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        """SIGTERM (what Kubernetes sends) and SIGINT end the run with a final checkpoint."""
        def handler(signum: int, _frame: object) -> None:
            self.stop_signal = signum

        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: the embedding program handles signals
                signal.signal(sig, handler)

    def shutdown(self) -> None:
        for actor in getattr(self, "actors", []):
            ray.kill(actor, no_restart=True)
        if self.group is not None:
            self.group.shutdown()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.output.close()
