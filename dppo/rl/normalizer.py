"""Running mean/variance with the parallel merge, so statistics from many actors combine exactly.

Chan, Golub, LeVeque (1979), "Updating formulae and a pairwise algorithm for computing sample
variances": merging two (count, mean, M2) summaries gives the summary of the pooled data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the actors' numpy path imports this module without torch
    import torch


@dataclass
class RunningStats:
    """Count, mean and variance of a stream of vectors (shape ``shape``)."""

    mean: np.ndarray
    var: np.ndarray
    count: float

    @classmethod
    def empty(cls, shape: tuple[int, ...] = ()) -> RunningStats:
        return cls(np.zeros(shape, np.float64), np.ones(shape, np.float64), 0.0)

    @classmethod
    def of(cls, batch: np.ndarray) -> RunningStats:
        """Statistics of a batch whose first axis indexes samples."""
        batch = np.asarray(batch, np.float64)
        return cls(batch.mean(axis=0), batch.var(axis=0), float(batch.shape[0]))

    def merge(self, other: RunningStats) -> RunningStats:
        """Statistics of the union of the two samples (parallel algorithm)."""
        if other.count == 0:
            return self.copy()
        if self.count == 0:
            return other.copy()
        total = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / total
        m2 = self.var * self.count + other.var * other.count + delta**2 * self.count * other.count / total
        return RunningStats(mean, m2 / total, total)

    def update(self, batch: np.ndarray) -> None:
        merged = self.merge(RunningStats.of(batch))
        self.mean, self.var, self.count = merged.mean, merged.var, merged.count

    def copy(self) -> RunningStats:
        return RunningStats(self.mean.copy(), self.var.copy(), self.count)

    def normalize(self, x: np.ndarray, clip: float) -> np.ndarray:
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -clip, clip).astype(np.float32)

    def to_state(self) -> dict[str, list[float] | float]:
        """Plain lists, so checkpoints load with ``torch.load(weights_only=True)``."""
        return {"mean": self.mean.tolist(), "var": self.var.tolist(), "count": self.count}

    @classmethod
    def from_state(cls, state: dict) -> RunningStats:
        return cls(np.asarray(state["mean"], np.float64), np.asarray(state["var"], np.float64), float(state["count"]))


class ValueNormalizer:
    """The value head's scale (rl_games' ``normalize_value``): the head learns returns standardized by the running
    mean and std of every return the learner has trained on, so its targets stay near unit scale whatever the
    rewards. Actors record the head's output as is; the learner turns it back into returns for GAE with the
    statistics that the weights which sampled it were trained against: those of that policy version, kept for the
    last few versions (with run.overlap_sampling a round samples with the weights before the last update). The
    statistics are keyed by the run's policy version, not by this object's own count of updates: a learner group
    restarted with an older checkpoint's trainer state beside newer weights finds the versions it makes from then on.
    A version no longer kept (or made before such a restart) falls back to the current statistics."""

    KEEP = 4  # versions whose statistics stay: overlap needs the previous one, the rest is margin

    def __init__(self) -> None:
        self.stats = RunningStats.empty()
        self.version = 0  # the policy version of the weights the last update made
        self.history = {0: self.stats.copy()}

    def to_returns(self, values: np.ndarray, version: int) -> np.ndarray:
        """The head's outputs (normalized) of weights ``version`` in the returns' scale, float32."""
        stats = self.history.get(version, self.stats)
        return (values * np.sqrt(stats.var + 1e-8) + stats.mean).astype(np.float32)

    def update(self, returns: np.ndarray, version: int) -> None:
        """Merge one update's returns in: the statistics of the weights this update makes, policy ``version``."""
        self.stats.update(np.asarray(returns, np.float64).reshape(-1))
        self.version = version
        self.history[self.version] = self.stats.copy()
        for old in [v for v in self.history if v <= self.version - self.KEEP]:
            del self.history[old]

    def normalize(self, returns: torch.Tensor) -> torch.Tensor:
        """Returns (or values in the returns' scale) as the head learns them, with the current statistics."""
        mean, std = float(self.stats.mean), float(np.sqrt(self.stats.var + 1e-8))
        return (returns - mean) / std

    def to_state(self) -> dict:
        """Plain numbers, so checkpoints load with ``torch.load(weights_only=True)``."""
        return {"version": self.version, "history": {v: s.to_state() for v, s in self.history.items()}}

    def load_state(self, state: dict) -> None:
        self.version = int(state["version"])
        self.history = {int(v): RunningStats.from_state(s) for v, s in state["history"].items()}
        self.stats = self.history[self.version].copy()
