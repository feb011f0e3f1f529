"""Run state: what a run has done so far and must carry across a resume.

Counters, the windows of the last 100 finished episodes, and each policy's normalizer statistics merged from
every actor's segments (a run without a policy map has one policy); the stop rules read them. ``to_state`` /
``restore`` get and set them in types that ``torch.load(weights_only=True)`` accepts; :mod:`dppo.run.checkpoint`
puts them in a checkpoint.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dppo.config import Config
from dppo.errors import RunFailure
from dppo.rl.normalizer import RunningStats
from dppo.rl.segment import Segment
from dppo.run.league import League

RETURN_WINDOW = 100
MIN_ENV_FAILURES = 10  # failures before their share of episodes can stop a run (one early failure is 100%)


@dataclass
class Counters:
    """Everything that must continue unchanged after a resume."""

    iteration: int = 0
    env_steps: int = 0
    episodes: int = 0
    wall_s: float = 0.0
    policy_version: int = 0
    bad_updates_in_row: int = 0
    eval_return_last: float | None = None  # run.eval_every: the last evaluation's mean return
    eval_return_best: float | None = None  # and the best one (checkpoints/best.pt holds its weights)
    eval_env_steps: int | None = None  # the env steps of the weights the last evaluation played
    env_failures: int = 0  # env copies that raised and were recreated, their episodes cut (dppo.envs.failures)
    env_failures_by_actor: dict[str, int] = field(default_factory=dict)  # the same by actor slot ("0", "1", ...)


class PolicyStats:
    """One policy's merged normalizer statistics and the window of its agents' last finished episodes."""

    def __init__(self, config: Config, vector_dim: int) -> None:
        env = config.env
        self.obs_stats = RunningStats.empty((vector_dim,)) if env.normalize_obs and vector_dim else None
        self.return_stats = RunningStats.empty() if env.normalize_reward else None
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.recent_lengths: deque[int] = deque(maxlen=RETURN_WINDOW)

    def absorb(self, segment: Segment) -> None:
        if self.obs_stats is not None and segment.obs_stats is not None:
            self.obs_stats = self.obs_stats.merge(segment.obs_stats)
        if self.return_stats is not None and segment.return_stats is not None:
            self.return_stats = self.return_stats.merge(segment.return_stats)
        self.recent_returns.extend(segment.episode_returns.tolist())
        self.recent_lengths.extend(segment.episode_lengths.tolist())

    def means(self) -> tuple[float | None, float | None]:
        """The window's mean return and mean length (None before any episode finished)."""
        if not self.recent_returns:
            return None, None
        return float(np.mean(self.recent_returns)), float(np.mean(self.recent_lengths))

    def to_state(self) -> dict[str, Any]:
        return {"obs_stats": self.obs_stats.to_state() if self.obs_stats else None,
                "return_stats": self.return_stats.to_state() if self.return_stats else None,
                "recent_returns": list(self.recent_returns), "recent_lengths": list(self.recent_lengths)}

    def restore(self, saved: dict[str, Any]) -> None:
        if saved["obs_stats"] is not None:
            self.obs_stats = RunningStats.from_state(saved["obs_stats"])
        if saved["return_stats"] is not None:
            self.return_stats = RunningStats.from_state(saved["return_stats"])
        self.recent_returns.extend(saved.get("recent_returns", []))
        self.recent_lengths.extend(saved.get("recent_lengths", []))


class RunState:
    """Counters, episode windows and each policy's normalizer statistics of one run."""

    def __init__(self, config: Config, vector_dim: int | dict[str, int]) -> None:
        """``vector_dim``: each policy's observation vector width (one number: every policy's)."""
        self.config = config
        self.counters = Counters()
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)  # every policy's episodes
        self.recent_lengths: deque[int] = deque(maxlen=RETURN_WINDOW)
        dims = vector_dim if isinstance(vector_dim, dict) else dict.fromkeys(config.policy_names, vector_dim)
        self.policies = {name: PolicyStats(config, dims[name]) for name in config.policy_names}
        self.league: League | None = None  # self-play's snapshot pool and ratings (a two-player game)

    @property
    def only(self) -> PolicyStats:
        """The statistics of a run with one policy (a run without a policy map)."""
        assert len(self.policies) == 1, "this run has several policies: read state.policies"
        return next(iter(self.policies.values()))

    @property
    def obs_stats(self) -> RunningStats | None:
        return self.only.obs_stats

    @obs_stats.setter
    def obs_stats(self, stats: RunningStats | None) -> None:
        self.only.obs_stats = stats

    @property
    def return_stats(self) -> RunningStats | None:
        return self.only.return_stats

    @property
    def lr_clock(self) -> float:
        """Env steps so far in iterations' worth: the learning-rate schedule's clock (see Trainer.learning_rate)."""
        return self.counters.env_steps / self.config.steps_per_iteration

    def return_mean(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def length_mean(self) -> float | None:
        return float(np.mean(self.recent_lengths)) if self.recent_lengths else None

    def absorb(self, segments: list[Segment]) -> tuple[int, list[float]]:
        """Count one iteration's segments in: env steps, finished episodes, merged normalizer statistics.
        Returns the env steps and the returns of the episodes that finished in them."""
        steps = sum(s.num_steps for s in segments)
        returns = np.concatenate([s.episode_returns for s in segments]).tolist()
        lengths = np.concatenate([s.episode_lengths for s in segments]).tolist()
        for seg in segments:
            self.policies[seg.policy_name].absorb(seg)
        self.recent_returns.extend(returns)
        self.recent_lengths.extend(lengths)
        c = self.counters
        c.iteration += 1
        c.env_steps += steps
        c.episodes += len(returns)
        c.policy_version += 1
        self.count_env_failures(segments)
        return steps, returns

    def count_env_failures(self, segments: list[Segment]) -> None:
        """The segments' env failures into the counters; more than faults.max_env_failure_share of the episodes
        ended so far (after MIN_ENV_FAILURES) is a RunFailure naming the env, the share and the latest cause."""
        c = self.counters
        for seg in segments:
            if seg.env_failures.count:
                key = str(seg.actor_id)
                c.env_failures += seg.env_failures.count
                c.env_failures_by_actor[key] = c.env_failures_by_actor.get(key, 0) + seg.env_failures.count
        latest = next((s.env_failures for s in reversed(segments) if s.env_failures.count), None)
        limit, ended = self.config.faults.max_env_failure_share, c.env_failures + c.episodes
        if latest is None or c.env_failures < MIN_ENV_FAILURES or c.env_failures <= limit * ended:
            return
        raise RunFailure(f"env {self.config.env.name}: {c.env_failures} of the {ended} episodes ended so far were cut "
                         f"by the env raising ({c.env_failures / ended:.0%}, more than faults.max_env_failure_share "
                         f"{limit:g}); the last: {latest.first}; fix the env, or raise faults.max_env_failure_share "
                         "if its episodes are long", latest.details)

    def stop_reason(self) -> str | None:
        """target_return (over a full window of training episodes, or on the last evaluation: run.target_on),
        total_steps or time_limit, in that order; None: go on."""
        run = self.config.run
        if run.target_on == "evaluation":
            mean, enough = self.counters.eval_return_last, True
        else:
            mean, enough = self.return_mean(), len(self.recent_returns) >= RETURN_WINDOW
        if run.target_return is not None and mean is not None and enough and mean >= run.target_return:
            return "target_return"
        if self.counters.env_steps >= run.total_steps:
            return "total_steps"
        if run.time_limit_s is not None and self.counters.wall_s >= run.time_limit_s:
            return "time_limit"
        return None

    def count_evaluation(self, mean: float, env_steps: int | None = None) -> bool:
        """An evaluation's mean return in (of the weights after ``env_steps``); True when it is the best so far."""
        c = self.counters
        c.eval_return_last, c.eval_env_steps = mean, env_steps
        best = c.eval_return_best is None or mean > c.eval_return_best
        if best:
            c.eval_return_best = mean
        return best

    def count_update(self, skipped_minibatches: int) -> int:
        """Updates with NaN/Inf losses or gradients in a row (their minibatches were skipped); a good update
        resets the streak, and faults.max_nonfinite_updates of them end the run."""
        c = self.counters
        c.bad_updates_in_row = c.bad_updates_in_row + 1 if skipped_minibatches else 0
        limit = self.config.faults.max_nonfinite_updates
        if c.bad_updates_in_row >= limit:
            raise RunFailure(f"{limit} updates in a row had NaN/Inf losses or gradients; lower "
                             "ppo.learning_rate or check the env's rewards")
        return c.bad_updates_in_row

    def to_state(self) -> dict[str, Any]:
        """What a resume needs of this state (the keys a checkpoint holds it under: see dppo.run.checkpoint). One
        policy's statistics are top-level keys (as before policy maps); several policies' are under ``policies``."""
        several = len(self.policies) > 1
        stats = {"obs_stats": None, "return_stats": None} if several else {
            key: self.only.to_state()[key] for key in ("obs_stats", "return_stats")}
        return {
            **stats,
            "counters": vars(self.counters).copy(),
            "recent_returns": list(self.recent_returns), "recent_lengths": list(self.recent_lengths),
            "league": self.league.to_state() if self.league is not None else None,
            **({"policies": {name: part.to_state() for name, part in self.policies.items()}} if several else {}),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Continue from :meth:`to_state`'s keys (a checkpoint holds them among its own; other keys are ignored).
        Counters added since a checkpoint was written take their defaults."""
        if len(self.policies) > 1:
            for name, part in self.policies.items():
                part.restore(saved["policies"][name])
        else:
            self.only.restore({"obs_stats": saved["obs_stats"], "return_stats": saved["return_stats"]})
        self.counters = Counters(**{**saved["counters"],
                                    "env_failures_by_actor": dict(saved["counters"].get("env_failures_by_actor", {}))})
        self.recent_returns.extend(saved["recent_returns"])
        self.recent_lengths.extend(saved["recent_lengths"])
        if self.league is not None and saved.get("league") is not None:
            self.league.restore(saved["league"])
