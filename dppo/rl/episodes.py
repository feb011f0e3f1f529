"""Whole episodes of a policy in one env: `dppo eval` and the evaluation actor of a training run both use this
loop, so an evaluation while training and one from a checkpoint measure the same thing."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from dppo.rl.agent import Agent
from dppo.rl.transforms import ObsNormalizer


def run_episodes(agent: Agent, env: gym.Env, normalize: ObsNormalizer, episodes: int, seed: int,
                 greedy: bool = True) -> list[float]:
    """Raw returns of ``episodes`` episodes, reset with seeds ``seed``, ``seed + 1``, ...: the policy's mode
    (``greedy``) or sampled actions, observations normalized with the frozen statistics in ``normalize``."""
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            action, _, _ = agent.act(normalize(agent.obs_spec.encode_one(obs)), greedy=greedy)
            obs, reward, terminated, truncated, _ = env.step(agent.action_spec.to_env(action)[0])
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        agent.end_episodes(np.ones(1, bool))  # a recurrent policy starts the next episode with a fresh memory
    return returns
