"""Small envs registered under the ``dppo/`` namespace for tests and fault drills.

- ``dppo/Counter-v0``: observation = steps since reset, reward 1; ends by termination at
  ``terminate_at`` (if set) or by truncation at ``max_episode_steps``. Makes episode boundaries,
  autoreset and bootstrapping checkable by eye.
- ``dppo/Faulty-v0``: CartPole-v1 that misbehaves on purpose at a given step count of its process:
  raises (``fail_at``), returns NaN (``nan_at``), or hangs (``hang_at`` for ``hang_s`` seconds).
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np


class CounterEnv(gym.Env):
    def __init__(self, terminate_at: int | None = None) -> None:
        self.observation_space = gym.spaces.Box(0.0, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.terminate_at = terminate_at
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        terminated = self.terminate_at is not None and self.t >= self.terminate_at
        return np.array([float(self.t)], np.float32), 1.0, terminated, False, {}


class FaultyEnv(gym.Wrapper):
    """CartPole with an injected fault once this process has taken a number of steps.

    ``fail_at``: raise at that step; ``persistent``: keep raising from then on (a recreated env too).
    ``nan_at``: NaN observations from that step on. ``hang_at``: sleep ``hang_s`` at that step.
    ``token_file``: when set, only the process that first creates this file misbehaves, so one actor
    of many can be made faulty.
    """

    steps_in_process = 0
    armed: bool | None = None

    def __init__(self, fail_at: int | None = None, persistent: bool = False, nan_at: int | None = None,
                 hang_at: int | None = None, hang_s: float = 5.0, token_file: str | None = None) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.fail_at, self.persistent, self.nan_at = fail_at, persistent, nan_at
        self.hang_at, self.hang_s, self.token_file = hang_at, hang_s, token_file

    def _armed(self) -> bool:
        if FaultyEnv.armed is None:
            if self.token_file is None:
                FaultyEnv.armed = True
            else:
                try:
                    os.close(os.open(self.token_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                    FaultyEnv.armed = True
                except FileExistsError:
                    FaultyEnv.armed = False
        return FaultyEnv.armed

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        FaultyEnv.steps_in_process += 1
        n = FaultyEnv.steps_in_process
        armed = self._armed() if n in {self.fail_at, self.nan_at, self.hang_at} or self.persistent else FaultyEnv.armed
        if armed and self.fail_at is not None and (n == self.fail_at or (self.persistent and n >= self.fail_at)):
            raise RuntimeError(f"injected env failure at step {n}")
        if armed and self.hang_at is not None and n == self.hang_at:
            time.sleep(self.hang_s)
        obs, reward, terminated, truncated, info = self.env.step(action)
        if armed and self.nan_at is not None and n >= self.nan_at:
            obs = np.full_like(obs, np.nan)
        return obs, reward, terminated, truncated, info


def register() -> None:
    if "dppo/Counter-v0" not in gym.registry:
        gym.register("dppo/Counter-v0", entry_point=CounterEnv, max_episode_steps=10)
        gym.register("dppo/Faulty-v0", entry_point=FaultyEnv, max_episode_steps=500)


register()
