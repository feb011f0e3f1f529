"""Reporting: one record per iteration to every sink, so progress.jsonl, Prometheus, TensorBoard and stdout
always agree; and the run's events (actor restarts, dropped segments, skipped updates, checkpoints) counted
once, for the metrics and for summary.json."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dppo.config import Config
from dppo.rl.env_info import iteration_means
from dppo.rl.ppo import TrainStats
from dppo.rl.segment import Segment
from dppo.run.logs import IterationLog, counted, format_return
from dppo.run.metrics import Metrics
from dppo.run.run_dir import RunDir, strict_json
from dppo.run.state import RunState
from dppo.run.tensorboard import TensorBoardLog

NOT_IN_RECORD = {"epochs_run", "skipped_minibatches"}  # TrainStats fields that are not progress columns
FAILURE_LINE_S = 30.0  # after the first env failure's warning, at most one count line this often


@dataclass
class FaultCounts:
    """Faults this process survived (summary.json); the metrics hold the same counts as counters."""

    actor_restarts: int = 0  # replacements started, whatever the cause
    actor_crashes: int = 0  # actor processes that died on a live node (these spend the crash-loop budget)
    node_losses: int = 0  # nodes that went away with actors of this run on them
    learner_restarts: int = 0
    segments_dropped: int = 0
    updates_skipped: int = 0
    hangs: int = 0  # processes past their deadline, killed and replaced (dppo.distributed.deadlines)


@dataclass
class ActorCounts:
    """The run's actors for summary.json: a run that trained with fewer than it asked for says so there."""

    asked: int  # run.actors
    alive: int = 0  # alive now (at the end: when the run finished)
    alive_sum: int = 0  # alive actors summed over this process's iterations, at each iteration's record
    iterations: int = 0

    def iteration(self) -> None:
        self.alive_sum += self.alive
        self.iterations += 1

    def summary(self) -> dict[str, Any]:
        mean = round(self.alive_sum / self.iterations, 2) if self.iterations else None
        return {"asked": self.asked, "alive": self.alive, "mean_alive": mean}


def sampling_phases(segments: list[Segment]) -> dict[str, float]:
    """The slowest actor's sampling seconds (``sample``: what the round waited for) and, of them, its seconds
    stepping envs (``env``) and in its policy (``inference``: the forward pass in the actor, or the wait for the
    inference service's reply); the rest is the actor's own work (encoding, normalizing, sending requests)."""
    slowest = max(segments, key=lambda segment: segment.sample_seconds)
    return {"sample": slowest.sample_seconds, "env": slowest.env_seconds, "inference": slowest.policy_seconds}


def policy_diagnostics(state: RunState, stats: dict[str, TrainStats]) -> dict[str, Any]:
    """Each policy's update diagnostics: a run of one policy has them as top-level keys; a run of several has, per
    policy, ``POLICY/key`` for every diagnostic and for the mean return and length of its agents' last episodes."""
    if len(stats) == 1:
        (only,) = stats.values()
        return {k: v for k, v in only.as_dict().items() if k not in NOT_IN_RECORD}
    columns: dict[str, Any] = {}
    for name, part in stats.items():
        returns, lengths = state.policies[name].means()
        columns.update({f"{name}/episode_return_mean": returns, f"{name}/episode_length_mean": lengths,
                        **{f"{name}/{k}": v for k, v in part.as_dict().items() if k not in NOT_IN_RECORD}})
    return columns


def progress_record(state: RunState, segments: list[Segment], steps: int, stats: dict[str, TrainStats],
                    phases: dict[str, float], iteration_s: float) -> dict[str, Any]:
    """One line of progress.jsonl: counters, episode means, throughput, each policy's diagnostics
    (:func:`policy_diagnostics`), the env's info figures (``info/KEY``: :func:`dppo.rl.env_info.iteration_means`, all
    policies' agents together), per-phase seconds (``phases``: the coordinator's sync, sample, wait, update and, of
    sample, env and inference; see :func:`sampling_phases`)."""
    c = state.counters
    return {
        "iteration": c.iteration, "env_steps": c.env_steps, "wall_s": round(c.wall_s, 3),
        "episodes": c.episodes, "episode_return_mean": state.return_mean(),
        "episode_length_mean": state.length_mean(),
        "steps_per_s": steps / iteration_s, "env_steps_delta": steps, "iteration_s": iteration_s,
        "policy_version": c.policy_version, "segments": len(segments) // len(stats),  # one per actor and policy
        "policy_lag": max(c.policy_version - 1 - s.policy_version for s in segments),
        "env_failures": c.env_failures,
        **policy_diagnostics(state, stats),
        **iteration_means(state.config.metrics.info_keys, [s.env_info for s in segments]),
        **{f"{k}_s": v for k, v in phases.items()},
    }


class Reporter:
    """The run's sinks (progress.jsonl, metrics, TensorBoard, stdout and train.log) and its event counts."""

    def __init__(self, config: Config, run_dir: RunDir) -> None:
        self.config, self.run_dir = config, run_dir
        self.name = config.run.name or run_dir.path.name  # logs, summary.json and dppo_run_info's run label
        self.metrics = Metrics(config.env.name, self.name)
        self.output = IterationLog(config.run.log_format, config.run.total_steps, log_file=run_dir.log)
        self.tensorboard: TensorBoardLog | None = None
        self.faults = FaultCounts()
        self.lost_nodes: set[str | None] = set()
        self.actors = ActorCounts(config.run.actors)
        self.failures_said: tuple[float, int] | None = None  # env failures: when the last line was said, at what count

    def open(self, state: RunState) -> None:
        """Start serving metrics and open TensorBoard (nothing of either exists before the run starts); a resumed
        run's counters and curves continue from its checkpoint."""
        cfg, counters = self.config, state.counters
        if cfg.metrics.port:
            port = self.metrics.serve(cfg.metrics.port, cfg.metrics.host)
            self.output.message(f"metrics on http://{cfg.metrics.host}:{port}/metrics")
        resumed = counters.iteration > 0
        if resumed:
            self.metrics.env_steps.inc(counters.env_steps)
            self.metrics.episodes.inc(counters.episodes)
            for actor, count in counters.env_failures_by_actor.items():
                self.metrics.env_failures.labels(actor=actor).inc(count)
        if cfg.run.tensorboard:
            self.tensorboard = TensorBoardLog(self.run_dir.tensorboard, cfg.to_yaml(),
                                              counters.env_steps if resumed else None)
        self.metrics.actors_desired.set(cfg.run.actors)
        self.metrics.init_actors(cfg.run.actors)

    def iteration(self, record: dict[str, Any], segments: list[Segment], new_returns: list[float],
                  phases: dict[str, float]) -> None:
        """The same record to progress.jsonl, the metrics, TensorBoard and stdout."""
        self.env_failures(segments, record["env_failures"])
        record = strict_json(record)
        self.run_dir.append_progress(record)
        self.metrics.record_iteration(record, new_returns, phases)
        sampled: dict[int, float] = {}  # per actor: its seconds sampling (several policies' segments: one stretch)
        for seg in segments:
            sampled[seg.actor_id] = max(sampled.get(seg.actor_id, 0.0), seg.sample_seconds)
        for actor_id, seconds in sampled.items():
            self.metrics.record_actor(actor_id, seconds)
        self.actors.iteration()
        if self.tensorboard is not None:
            self.tensorboard.record(record)
        self.output.iteration(record)

    # ---- events ------------------------------------------------------------------------------------
    def message(self, text: str) -> None:
        self.output.message(text)

    def env_failures(self, segments: list[Segment], total: int) -> None:
        """Env copies that raised in these segments (``total``: the run's so far): counted by actor; the run's first
        is said with its exception and file:line (its traceback to train.log), later ones as a count line at most
        every FAILURE_LINE_S seconds, so a flaky simulator is seen without flooding the log."""
        failed = [seg for seg in segments if seg.env_failures.count]
        for seg in failed:
            self.metrics.env_failures.labels(actor=str(seg.actor_id)).inc(seg.env_failures.count)
        if not failed:
            return
        now = time.monotonic()
        if self.failures_said is None:
            first = failed[0]
            self.output.message(
                f"env {self.config.env.name} raised in actor {first.actor_id}: {first.env_failures.first}; that env "
                "copy was recreated and its episode cut there (not counted as a return), the rest of the segment "
                f"kept. Failures are counted (env_failures in progress.jsonl and summary.json); the run stops past "
                f"faults.max_env_failure_share {self.config.faults.max_env_failure_share:g} of episodes")
            self.output.to_file(f"the env's traceback:\n{first.env_failures.details}")
            self.failures_said = (now, total)
        elif now - self.failures_said[0] >= FAILURE_LINE_S and total > self.failures_said[1]:
            self.output.message(f"env failures: {total} so far (last: {failed[-1].env_failures.first})")
            self.failures_said = (now, total)

    def actor_lost(self, index: int, cause: str, node: str | None) -> None:
        """An actor was lost, with its node (``cause`` "node") or alone ("crash"); a replacement is pending."""
        self.metrics.actor_restarts.labels(actor=str(index)).inc()
        self.metrics.actor_losses.labels(cause=cause).inc()
        self.faults.actor_restarts += 1
        if cause == "crash":
            self.faults.actor_crashes += 1
        elif cause == "node" and (node is None or node not in self.lost_nodes):
            self.lost_nodes.add(node)
            self.faults.node_losses += 1

    def actors_changed(self, alive: int, pending: int) -> None:
        self.actors.alive = alive
        self.metrics.actors_alive.set(alive)
        self.metrics.actors_pending.set(pending)

    def hung(self, process: str, line: str) -> None:
        """A process of kind ``process`` (actor, learner, inference, evaluation) missed its deadline: ``line`` says
        who, doing what, for how long; it is being replaced."""
        self.output.message(line)
        self.metrics.hangs.inc()
        self.faults.hangs += 1

    def segment_dropped(self, reason: str) -> None:
        self.metrics.segments_dropped.labels(reason=reason).inc()
        self.faults.segments_dropped += 1

    def learner_restarted(self) -> None:
        self.metrics.learner_restarts.inc()
        self.faults.learner_restarts += 1

    def update_skipped(self) -> None:
        self.metrics.updates_skipped.inc()
        self.faults.updates_skipped += 1

    def learner_timings(self, timings: list[list[tuple[float, float]]]) -> None:
        """Per learner rank: the update's seconds and the part of them in all-reduce (0 for one learner), summed
        over the policies' learner groups (``timings``: each group's, by rank)."""
        for rank, parts in enumerate(zip(*timings, strict=True)):
            update_s, reduce_s = sum(u for u, _ in parts), sum(r for _, r in parts)
            self.metrics.learner_update_seconds.labels(learner=str(rank)).observe(update_s)
            self.metrics.learner_allreduce_seconds.labels(learner=str(rank)).observe(reduce_s)

    def evaluated_at_end(self, record: dict[str, Any], env_steps: int) -> None:
        """An evaluation that finished after the last iteration (``record``: its progress keys; ``env_steps``: the
        run's): no progress line is left to hold it, so a line, the gauges and TensorBoard say it."""
        episodes, steps = counted(record["eval_episodes"], "episode"), record["eval_env_steps"]
        self.output.message(f"evaluation of the weights at {steps:,} env steps: return "
                            f"{format_return(record['eval_return_mean'])} over {episodes}"
                            + (" (the final weights)" if steps == env_steps else ""))
        self.metrics.set_gauges(record)
        if self.tensorboard is not None:
            self.tensorboard.record({**record, "env_steps": record["eval_env_steps"]})

    def checkpoint_written(self, path: Path) -> None:
        self.metrics.checkpoints.inc()
        self.metrics.checkpoint_bytes.set(path.stat().st_size)

    # ---- the end -------------------------------------------------------------------------------------
    def summary(self, state: RunState, reason: str, wall_s: float, startup_s: dict[str, float],
                first_iteration_s: float | None, losses: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
        """summary.json's content, written atomically; ``losses``: the other actor groups' (learners, evaluation,
        inference service) lost actors by cause (the sampling actors' are the fault counters)."""
        c = state.counters
        summary = strict_json({
            "solved": reason == "target_return", "reason": reason, "wall_s": round(wall_s, 3),
            "env_steps": c.env_steps, "iterations": c.iteration, "episodes": c.episodes,
            "episode_return_mean": state.return_mean(), "target_return": self.config.run.target_return,
            "run": self.name, "env": self.config.env.name, "actors": self.actors.summary(), **asdict(self.faults),
            "env_failures": c.env_failures, "env_failures_by_actor": dict(sorted(c.env_failures_by_actor.items())),
            **({"eval_return_mean": c.eval_return_last, "eval_return_best": c.eval_return_best,
                "eval_env_steps": c.eval_env_steps} if self.config.run.eval_every else {}),
            "losses": losses or {}, "startup_s": startup_s, "first_iteration_s": first_iteration_s,
            "finished_at": time.time(),  # epoch seconds: what follows (shutdown, exit) is the process's end
        })
        self.run_dir.write_summary(summary)
        return summary

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        self.output.close()
