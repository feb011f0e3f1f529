"""The latency wrapper: an env step held to a fixed latency in all, the env's own work included."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

from dppo.envs.latency import LatencyWrapper


class SlowEnv(gym.Env):
    """An env whose own step takes ``work_s`` (sleeping): what LatencyWrapper must count, not add to."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(self.work_s)
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_latency_wrapper_holds_the_whole_step_to_its_latency() -> None:
    """4 ms a step in all, the env's own 3 ms included: 40 steps take 160 ms, not 280 ms (latency on top)."""
    env = LatencyWrapper(SlowEnv(work_s=0.003), latency_ms=4.0)
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(40):
        env.step(0)
    elapsed = time.perf_counter() - start
    assert 0.160 <= elapsed < 0.220, elapsed  # never less than the latency; far below the 0.280 of adding it
