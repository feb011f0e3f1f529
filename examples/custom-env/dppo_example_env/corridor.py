"""Walk right along a corridor to the goal: +1 there, -0.01 per step. Optimal return 1 - 0.01 (length - 1)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class CorridorEnv(gym.Env):
    """Observation: one-hot position (Box); actions: 0 left, 1 right."""

    def __init__(self, length: int = 4) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length + 1, np.float32)
        obs[self.pos] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.pos = max(0, self.pos + (1 if int(action) == 1 else -1))
        done = self.pos == self.length
        return self._obs(), 1.0 if done else -0.01, done, False, {}
