"""GAE against a plain per-env reference and a hand-computed case."""

from __future__ import annotations

import numpy as np
import pytest

from dppo.rl.advantages import gae


def reference_gae(rewards, values, terminated, truncated, final_values, last_values, gamma, lam):
    """One env at a time, written the long way from the definitions."""
    steps, envs = rewards.shape
    adv = np.zeros((steps, envs))
    for e in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            if terminated[t, e]:
                delta = rewards[t, e] - values[t, e]
                running = delta
            elif truncated[t, e]:
                delta = rewards[t, e] + gamma * final_values[t, e] - values[t, e]
                running = delta
            else:
                next_value = last_values[e] if t == steps - 1 else values[t + 1, e]
                delta = rewards[t, e] + gamma * next_value - values[t, e]
                running = delta + gamma * lam * running
            adv[t, e] = running
    return adv, adv + values


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_reference_on_random_segments(seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps, envs = 40, 6
    rewards = rng.normal(size=(steps, envs)).astype(np.float32)
    values = rng.normal(size=(steps, envs)).astype(np.float32)
    terminated = rng.random((steps, envs)) < 0.1
    truncated = (rng.random((steps, envs)) < 0.1) & ~terminated
    final_values = np.where(truncated, rng.normal(size=(steps, envs)), 0).astype(np.float32)
    last_values = rng.normal(size=envs).astype(np.float32)
    assert terminated.any() and truncated.any()
    adv, ret = gae(rewards, values, terminated, truncated, final_values, last_values, 0.97, 0.9)
    ref_adv, ref_ret = reference_gae(rewards, values, terminated, truncated, final_values, last_values, 0.97, 0.9)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_three_steps_by_hand_bootstrap_truncation_and_the_segment_cut() -> None:
    """gamma 0.5, lambda 0.5, one env: step 0 continues, step 1 is truncated (V(final) = 4), step 2 is cut."""
    rewards = np.array([[1.0], [2.0], [3.0]], np.float32)
    values = np.array([[1.0], [2.0], [1.0]], np.float32)
    terminated = np.zeros((3, 1), bool)
    truncated = np.array([[False], [True], [False]])
    final_values = np.array([[0.0], [4.0], [0.0]], np.float32)
    last_values = np.array([2.0], np.float32)
    adv, ret = gae(rewards, values, terminated, truncated, final_values, last_values, 0.5, 0.5)
    # t=2: 3 + 0.5*2 - 1 = 3 (segment cut: bootstrap V(s_T) = 2)
    # t=1: 2 + 0.5*4 - 2 = 2 (truncated: bootstrap V(final obs) = 4, recursion stops)
    # t=0: delta = 1 + 0.5*2 - 1 = 1; A = 1 + 0.25*2 = 1.5
    np.testing.assert_allclose(adv[:, 0], [1.5, 2.0, 3.0])
    np.testing.assert_allclose(ret[:, 0], [2.5, 4.0, 4.0])


def test_termination_does_not_bootstrap_even_when_also_truncated() -> None:
    rewards = np.array([[1.0]], np.float32)
    values = np.array([[0.5]], np.float32)
    adv, _ = gae(rewards, values, np.array([[True]]), np.array([[True]]), np.array([[100.0]], np.float32),
                 np.array([100.0], np.float32), 0.99, 0.95)
    # terminated wins over truncated: the value of the next state is 0
    np.testing.assert_allclose(adv, [[0.5]])
