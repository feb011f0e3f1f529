"""What happens to env data between the env and the Segment, outside the sampler's step loop.

Each transform keeps its own per-env state and is applied once per step, in the sampler's order:
NaN/Inf scrubbing (reported, never silently trained on), observation normalization with the statistics
the driver broadcast, episode bookkeeping on raw rewards, Atari's life loss, and the learning reward
(sign clipping, scaling by the running std of the discounted return). The raw observations and discounted
returns an actor saw are summarized per segment, so the driver can merge every actor's statistics
exactly (:mod:`dppo.rl.normalizer`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dppo.rl.normalizer import RunningStats
from dppo.rl.segment import EnvFailures
from dppo.rl.spaces import Obs


def scrub_nonfinite(values: np.ndarray | None) -> bool:
    """Replace NaN/Inf with 0 in place; True when there were any (the segment is then flagged)."""
    if values is None or np.isfinite(values).all():
        return False
    np.nan_to_num(values, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    return True


class ObsNormalizer:
    """Running mean/std normalization of the encoded vector, clipped (images are never normalized).

    Every actor normalizes with the statistics last broadcast, so all of them map an observation alike; the
    raw vectors a segment saw are summarized in :meth:`summary` for the driver's merge.
    """

    def __init__(self, enabled: bool, clip: float, vector_dim: int) -> None:
        self.enabled = enabled and vector_dim > 0
        self.clip = clip
        self.stats = RunningStats.empty((vector_dim,))
        self._raw: np.ndarray | None = None

    def __call__(self, obs: Obs) -> Obs:
        """Normalize the vector part in place (it is the sampler's own encoded copy)."""
        if self.enabled and obs.vector is not None:
            obs.vector[:] = self.stats.normalize(obs.vector, self.clip)
        return obs

    def start(self, steps: int, num_envs: int) -> None:
        """A new segment: a buffer for the raw vectors it will see."""
        self._raw = np.empty((steps, num_envs, self.stats.mean.shape[0]), np.float64) if self.enabled else None

    def record(self, t: int, obs: Obs) -> None:
        """Keep step t's raw (not yet normalized) vector."""
        if self._raw is not None:
            self._raw[t] = obs.vector

    def summary(self, live: np.ndarray | None = None) -> RunningStats | None:
        """What this segment's observations add to the global statistics. ``live``: (T, E) bool, the steps whose
        recorded observation is a live agent's (many agents: the padding of one that left adds nothing)."""
        if self._raw is None:
            return None
        raw = self._raw if live is None else self._raw[live]
        raw = raw.reshape(-1, raw.shape[-1])
        return RunningStats.of(raw) if len(raw) else RunningStats.empty(raw.shape[1:])


class LearningReward:
    """The reward the trainer learns from; reported episode returns stay raw.

    ``clip_sign`` keeps only the sign (Atari); ``scale`` divides by the std of the running discounted return
    and clips to +-``clip`` (Engstrom et al. 2020, as gymnasium's NormalizeReward), with the statistics last
    broadcast; each segment's discounted returns go back in :meth:`summary`.
    """

    def __init__(self, clip_sign: bool, scale: bool, num_envs: int, gamma: float, clip: float) -> None:
        self.clip_sign, self.scale, self.gamma, self.clip = clip_sign, scale, gamma, clip
        self.stats = RunningStats.empty()
        self.discounted_return = np.zeros(num_envs, np.float64)
        self._returns: np.ndarray | None = None

    def start(self, steps: int, num_envs: int) -> None:
        self._returns = np.empty((steps, num_envs), np.float64) if self.scale else None

    def __call__(self, t: int, reward: np.ndarray) -> np.ndarray:
        if self.clip_sign:
            reward = np.sign(reward)
        if not self.scale:
            return reward
        self.discounted_return = self.discounted_return * self.gamma + reward
        self._returns[t] = self.discounted_return
        std = np.sqrt(self.stats.var + 1e-8)
        return np.clip(reward / std, -self.clip, self.clip)

    def end_episodes(self, done: np.ndarray) -> None:
        self.discounted_return[done] = 0

    def summary(self, live: np.ndarray | None = None) -> RunningStats | None:
        """What this segment's discounted returns add to the global statistics. ``live``: (T, E) bool, the steps
        a live agent acted in (many agents: the padding steps of one that left add nothing)."""
        if self._returns is None:
            return None
        returns = self._returns if live is None else self._returns[live]
        return RunningStats.of(returns.reshape(-1)) if returns.size else RunningStats.empty()


class LifeLoss:
    """A lost life ends the episode for learning only (no bootstrap), while episodes stay whole games.

    Reads ``info["lives"]`` (Atari); the env's own ends are left alone."""

    def __init__(self, lives: np.ndarray) -> None:
        self.lives = np.asarray(lives)

    def __call__(self, terminated: np.ndarray, done: np.ndarray, info: dict) -> np.ndarray:
        lives = np.asarray(info["lives"])
        terminated = terminated | ((lives < self.lives) & ~done)
        self.lives = lives
        return terminated


class EpisodeStats:
    """Raw return and length of every env's current episode, those that finished in this segment, and the env
    failures since the last segment (:mod:`dppo.envs.failures`): an episode an env's failure cut is counted as a
    failure, never as a return, so a crashing simulator cannot pass its cut-short episodes off as results."""

    def __init__(self, num_envs: int) -> None:
        self.episode_return = np.zeros(num_envs, np.float64)
        self.episode_length = np.zeros(num_envs, np.int64)
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.failures = EnvFailures()

    def start(self) -> None:
        """A new segment (failures counted since the last one stay: a resampled segment carries them)."""
        self.returns, self.lengths = [], []

    def step(self, reward: np.ndarray) -> None:
        self.episode_return += reward
        self.episode_length += 1

    def end_episodes(self, done: np.ndarray, failed: np.ndarray | None = None,
                     failures: Sequence[tuple[str, str]] = ()) -> None:
        """Episodes ended where ``done``; those ``failed`` were cut by their env raising (``failures``: each one's
        line and traceback)."""
        for i in np.flatnonzero(done if failed is None else done & ~failed):
            self.returns.append(float(self.episode_return[i]))
            self.lengths.append(int(self.episode_length[i]))
        self.episode_return[done] = 0
        self.episode_length[done] = 0
        for line, details in failures:
            self.count_failure(line, details)

    def count_failure(self, line: str, details: str) -> None:
        self.failures.add(line, details)

    def take_failures(self) -> EnvFailures:
        """The failures since the last segment, for the segment being returned."""
        taken, self.failures = self.failures, EnvFailures()
        return taken

    def reset(self) -> None:
        """The envs were recreated: every episode starts over."""
        self.episode_return[:] = 0
        self.episode_length[:] = 0
