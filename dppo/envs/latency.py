"""An artificial per-step latency that releases the CPU: a stand-in for a remote simulator or a robot, for
benchmarks (``env.latency_ms``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import gymnasium as gym


class LatencyWrapper(gym.Wrapper):
    """Makes each step take latency_ms in all, sleeping out what the wrapped env's own step leaves, so the
    CPU is released as a remote simulator or a robot would release it. The step as a whole is timed, not
    the sleep alone: a sleep's overshoot and the env's own work would otherwise add to every step.
    ``clock`` and ``sleep`` are injectable so tests check the computed waits exactly, without wall time."""

    def __init__(self, env: gym.Env, latency_ms: float, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(env)
        self.delay = latency_ms / 1000.0
        self.debt = 0.0  # how much the last step overran: taken off the next, so the mean latency is exact
        self.clock, self.sleep = clock, sleep

    def step(self, action):
        start = self.clock()
        result = self.env.step(action)
        target = self.delay - self.debt
        wait = target - (self.clock() - start)
        if wait > 0:
            self.sleep(wait)
        # bounded: one long stall must not turn the following steps into a burst without latency
        self.debt = min(self.clock() - start - target, self.delay)
        return result
