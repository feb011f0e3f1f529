"""Segment: what one actor samples per iteration (the learners train on it), T steps of E envs; and its summary, the
few numbers the driver needs of it when the learners are processes of their own and fetch the segment themselves."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from dppo.config.policies import DEFAULT_POLICY
from dppo.rl.normalizer import RunningStats
from dppo.rl.spaces import Obs


@dataclass
class EnvFailures:
    """The env copies that raised while a segment was sampled, each recreated and its episode cut there (left out of
    episode returns and lengths): how many, and the first one's exception and traceback (the warning's words)."""

    count: int = 0
    first: str = ""  # the exception and the user's file:line: "ValueError: boom (at mysim.py:42)"
    details: str = ""  # its whole traceback (train.log)

    def add(self, line: str, details: str) -> None:
        if not self.count:
            self.first, self.details = line, details
        self.count += 1


@dataclass
class Segment:
    """T x E transitions sampled with one policy version, plus the episodes that finished in them.

    Observations are stored as the policy saw them (normalized when obs normalization is on), rewards
    as the trainer should use them (scaled when reward scaling is on); episode returns are raw.
    """

    obs: Obs  # encoded: image (T, E, H, W, C) uint8 and/or vector (T, E, D) float32
    actions: np.ndarray  # (T, E, *stored_shape): int64 (Discrete, MultiDiscrete, MultiBinary), float32 unclipped (Box)
    log_probs: np.ndarray  # (T, E) float32, log-prob of the (unclipped) action
    values: np.ndarray  # (T, E) float32, V(obs_t)
    rewards: np.ndarray  # (T, E) float32
    terminated: np.ndarray  # (T, E) bool: true end of the MDP, no bootstrap
    truncated: np.ndarray  # (T, E) bool: time limit, bootstrap from final_values
    final_values: np.ndarray  # (T, E) float32: V(final obs) where truncated, else 0
    last_values: np.ndarray  # (E,) float32: V(s_T), the bootstrap at the segment cut
    episode_returns: np.ndarray  # (n_episodes,) float64, raw (unscaled) returns of finished episodes
    episode_lengths: np.ndarray  # (n_episodes,) int64
    policy_version: int
    actor_id: int
    sample_seconds: float  # the segment's wall time in the actor, start to last value
    env_seconds: float = 0.0  # of sample_seconds: in the envs' step calls
    policy_seconds: float = 0.0  # of sample_seconds: the policy's forward pass, or the wait for the service's reply
    obs_stats: RunningStats | None = None  # what this segment's observations add to the global stats
    return_stats: RunningStats | None = None  # same for the discounted return (reward scaling)
    nonfinite: bool = False  # NaN/Inf seen in raw observations or rewards
    initial_memory: np.ndarray | None = None  # recurrent policies: (2, E, hidden) float32, the LSTM's (h, c) at t=0
    starts: np.ndarray | None = None  # recurrent policies: (T, E) bool, obs_t starts an episode (memory zeroed)
    # self-play: (games, 2) float64, each game finished since the last segment: its opponent id, score (the actor's
    # :class:`dppo.rl.opponents.SelfPlayGames` fills it; the sampler knows no games)
    match_results: np.ndarray | None = None
    policy_name: str = DEFAULT_POLICY  # the policy of the run's policy map that sampled it (and trains on it)
    # many agents: (T + 1, E) bool, obs_t is a live agent's (row T: the bootstrap's); False where the agent had left
    # and its column saw padding, a step the losses skip. None: every step live (every single-agent segment)
    active: np.ndarray | None = None
    env_failures: EnvFailures = field(default_factory=EnvFailures)  # env copies that raised and were recreated
    # metrics.info_keys: each key's value in the last info of every episode that ended here (dppo.rl.env_info)
    env_info: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return int(self.rewards.size)

    def summary(self) -> SegmentSummary:
        """What the driver reads of this segment (counters, episode windows, normalizer statistics, timings, faults,
        self-play results, the env's info figures), without the T x E arrays."""
        return SegmentSummary(**{f.name: getattr(self, f.name) for f in fields(SegmentSummary)})


@dataclass
class SegmentSummary:
    """A Segment's numbers without its arrays: what the driver receives from an actor when the learners fetch the
    segment by reference (run.learners > 1), a few hundred bytes whatever T, E and the observations' size. It reads
    like the Segment wherever the driver reads one."""

    num_steps: int
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    policy_version: int
    actor_id: int
    sample_seconds: float
    env_seconds: float
    policy_seconds: float
    obs_stats: RunningStats | None
    return_stats: RunningStats | None
    nonfinite: bool
    match_results: np.ndarray | None
    policy_name: str
    env_failures: EnvFailures
    env_info: dict[str, np.ndarray]

