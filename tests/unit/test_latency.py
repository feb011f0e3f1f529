"""The latency wrapper: an env step held to a fixed latency in all, the env's own work included. The clock and the
sleep are a hand-driven stand-in, so the waits the wrapper computes are checked exactly, with no wall time."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from dppo.envs.latency import LatencyWrapper

MS = 0.001


class Clock:
    """Seconds that move when the env works or the wrapper sleeps; a sleep lasts ``overshoot`` longer than asked,
    as a real one does."""

    def __init__(self, overshoot: float = 0.0) -> None:
        self.now = 0.0
        self.overshoot = overshoot
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds + self.overshoot


class SlowEnv(gym.Env):
    """An env whose own steps take ``work`` seconds each, on ``clock``: what LatencyWrapper must count, not add to."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, clock: Clock, work: list[float]) -> None:
        self.clock, self.work = clock, list(work)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.clock.now += self.work.pop(0)
        return np.zeros(1, np.float32), 0.0, False, False, {}


def run(latency_ms: float, work: list[float], overshoot: float = 0.0) -> tuple[list[float], list[float]]:
    """(each step's duration, each sleep asked for) over ``len(work)`` steps."""
    clock = Clock(overshoot)
    env = LatencyWrapper(SlowEnv(clock, work), latency_ms, clock=clock, sleep=clock.sleep)
    env.reset(seed=0)
    durations = []
    for _ in work:
        before = clock.now
        env.step(0)
        durations.append(clock.now - before)
    return durations, clock.sleeps


def test_the_sleep_fills_the_step_up_to_its_latency_not_on_top() -> None:
    """4 ms a step in all, the env's own 3 ms included: a 1 ms sleep each (4 ms on top would make 7 ms steps)."""
    durations, sleeps = run(4.0, [3 * MS] * 5)
    assert sleeps == pytest.approx([1 * MS] * 5, abs=1e-12)
    assert durations == pytest.approx([4 * MS] * 5, abs=1e-12)


def test_a_sleep_s_overshoot_is_taken_off_the_next_step() -> None:
    """Sleeps last 0.5 ms longer than asked: the first step runs 0.5 ms over, each later one asks 0.5 ms less, so
    the steps average the latency (only the last step's overshoot is not paid back)."""
    durations, sleeps = run(4.0, [3 * MS] * 4, overshoot=0.5 * MS)
    assert sleeps == pytest.approx([1 * MS, 0.5 * MS, 0.5 * MS, 0.5 * MS], abs=1e-12)
    assert durations == pytest.approx([4.5 * MS, 4 * MS, 4 * MS, 4 * MS], abs=1e-12)
    assert sum(durations) == pytest.approx(4 * 4 * MS + 0.5 * MS, abs=1e-12)


def test_a_stall_is_paid_back_by_at_most_one_latency() -> None:
    """A 10 ms step against a 4 ms latency overruns by 6 ms; the debt is capped at 4 ms, which the next steps (2.5 ms
    of work each) pay back before sleeping again: 22 ms for 5 steps, not a longer burst without latency."""
    durations, sleeps = run(4.0, [10 * MS] + [2.5 * MS] * 4)
    assert durations == pytest.approx([10 * MS, 2.5 * MS, 2.5 * MS, 3 * MS, 4 * MS], abs=1e-12)
    assert sleeps == pytest.approx([0.5 * MS, 1.5 * MS], abs=1e-12)


def test_the_default_clock_and_sleep_are_the_real_ones() -> None:
    import time

    env = LatencyWrapper(SlowEnv(Clock(), []), 1.0)
    assert (env.clock, env.sleep) == (time.perf_counter, time.sleep)
