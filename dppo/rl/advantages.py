"""Generalized advantage estimation as a pure function over a segment's time axis.

Arrays are (T, E): time first. ``terminated`` and ``truncated`` are kept apart: a terminal state has
value 0, a time-limit cut is bootstrapped from V(final observation) (Pardo et al. 2018, "Time Limits
in Reinforcement Learning"; SB3 issue #633), and the segment cut at T is bootstrapped from V(s_T).
Either kind of episode end stops the advantage recursion.
"""

from __future__ import annotations

import numpy as np


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    final_values: np.ndarray,
    last_values: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and value targets (returns = advantages + values), both (T, E) float32.

    ``values[t]`` is V(s_t); ``final_values[t]`` is V of the observation that ended the episode at t
    (used only where ``truncated[t]``); ``last_values`` is V(s_T) for the step after the segment.
    """
    steps = rewards.shape[0]
    advantages = np.zeros_like(values, dtype=np.float64)
    next_advantage = np.zeros_like(last_values, dtype=np.float64)
    next_value = last_values.astype(np.float64)
    for t in reversed(range(steps)):
        term = terminated[t].astype(np.float64)
        trunc = truncated[t].astype(np.float64) * (1.0 - term)
        bootstrap = np.where(trunc > 0, final_values[t], next_value) * (1.0 - term)
        delta = rewards[t] + gamma * bootstrap - values[t]
        continues = (1.0 - term) * (1.0 - trunc)
        next_advantage = delta + gamma * lam * continues * next_advantage
        advantages[t] = next_advantage
        next_value = values[t].astype(np.float64)
    returns = advantages + values
    return advantages.astype(np.float32), returns.astype(np.float32)
