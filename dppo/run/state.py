"""Run state: what a run has done so far and must carry across a resume.

Counters, the windows of the last 100 finished episodes, and the normalizer statistics merged from every
actor's segments; the stop rules read them. ``to_checkpoint`` / ``restore`` are the checkpoint format
(format 1): every value in types that ``torch.load(weights_only=True)`` accepts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from dppo.config import Config, ModelConfig
from dppo.errors import RunFailure
from dppo.rl.normalizer import RunningStats
from dppo.rl.segment import Segment
from dppo.run.checkpoint import CheckpointError

RETURN_WINDOW = 100
CHECKPOINT_FORMAT = 1


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


class RunState:
    """Counters, episode windows and normalizer statistics of one run."""

    def __init__(self, config: Config, vector_dim: int) -> None:
        self.config = config
        self.counters = Counters()
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.recent_lengths: deque[int] = deque(maxlen=RETURN_WINDOW)
        env = config.env
        self.obs_stats = RunningStats.empty((vector_dim,)) if env.normalize_obs and vector_dim else None
        self.return_stats = RunningStats.empty() if env.normalize_reward else None

    @property
    def progress(self) -> float:
        """Env steps so far in iterations' worth (the learning-rate schedule's clock; see Trainer.learning_rate)."""
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
            if self.obs_stats is not None and seg.obs_stats is not None:
                self.obs_stats = self.obs_stats.merge(seg.obs_stats)
            if self.return_stats is not None and seg.return_stats is not None:
                self.return_stats = self.return_stats.merge(seg.return_stats)
        self.recent_returns.extend(returns)
        self.recent_lengths.extend(lengths)
        c = self.counters
        c.iteration += 1
        c.env_steps += steps
        c.episodes += len(returns)
        c.policy_version += 1
        return steps, returns

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

    def count_evaluation(self, mean: float) -> bool:
        """An evaluation's mean return in; True when it is the best so far."""
        c = self.counters
        c.eval_return_last = mean
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

    def to_checkpoint(self, model_state: dict[str, Any], trainer_state: dict[str, Any],
                      progress: dict[str, Any] | None = None) -> dict[str, Any]:
        """Everything a resume needs; ``progress`` is the iteration's progress record, which a run killed after
        the checkpoint but before its progress line gets back on resume."""
        return {
            "format": CHECKPOINT_FORMAT, "env_id": self.config.env.name, "config": self.config.model_dump(mode="json"),
            "model": model_state, "trainer": trainer_state,
            "obs_stats": self.obs_stats.to_state() if self.obs_stats else None,
            "return_stats": self.return_stats.to_state() if self.return_stats else None,
            "counters": vars(self.counters).copy(),
            "recent_returns": list(self.recent_returns), "recent_lengths": list(self.recent_lengths),
            "progress": progress,
        }

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Continue from a checkpoint of the same env (the model and trainer state are the learners' to load)."""
        check_resumable(checkpoint, self.config)
        if checkpoint["obs_stats"] is not None:
            self.obs_stats = RunningStats.from_state(checkpoint["obs_stats"])
        if checkpoint["return_stats"] is not None:
            self.return_stats = RunningStats.from_state(checkpoint["return_stats"])
        self.counters = Counters(**checkpoint["counters"])
        self.recent_returns.extend(checkpoint["recent_returns"])
        self.recent_lengths.extend(checkpoint["recent_lengths"])


def check_resumable(checkpoint: dict[str, Any], config: Config) -> None:
    """A checkpoint resumes only into the same env and network shape (checked before anything is written)."""
    saved, wanted = checkpoint.get("env_id"), config.env.name
    if saved != wanted:
        raise CheckpointError(f"the checkpoint is for env {saved!r}, not {wanted!r}; resume with the run's own "
                              "config or start a new --run-dir")
    saved_model = checkpoint.get("config", {}).get("model") or {}
    try:  # keys added since the checkpoint was written take their defaults
        same = ModelConfig.model_validate(saved_model) == config.model
    except ValidationError:
        same = False
    if not same:
        raise CheckpointError(f"the checkpoint's model settings {saved_model} differ from the config's; "
                              "resume with the run's own model section")
