"""Running mean/variance with the parallel merge, so statistics from many actors combine exactly.

Chan, Golub, LeVeque (1979), "Updating formulae and a pairwise algorithm for computing sample
variances": merging two (count, mean, M2) summaries gives the summary of the pooled data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
