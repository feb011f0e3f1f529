"""Whole episodes of a policy in one env: `dppo eval` and the evaluation actor of a training run both use this
loop, so an evaluation while training and one from a checkpoint measure the same thing."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from dppo.envs.api import old_api, old_step_error
from dppo.envs.user_code import EnvLoadError
from dppo.rl.agent import Agent
from dppo.rl.transforms import ObsNormalizer


def run_episodes(agent: Agent, env: gym.Env, normalize: ObsNormalizer, episodes: int, seed: int,
                 greedy: bool = True) -> list[float]:
    """Raw returns of ``episodes`` episodes, reset with seeds ``seed``, ``seed + 1``, ...: the policy's mode
    (``greedy``) or sampled actions, observations normalized with the frozen statistics in ``normalize``."""
    try:
        return _episodes(agent, env, normalize, episodes, seed, greedy)
    except Exception as err:  # an env of the old gym API fails in gymnasium's unpacking: say so
        old = old_step_error(err, _name(env))
        if old is None and (problem := old_api(env, seed)) is not None:
            old = EnvLoadError(f"env {_name(env)!r}: {problem}")
        if old is None:
            raise
        raise old from None


def _episodes(agent: Agent, env: gym.Env, normalize: ObsNormalizer, episodes: int, seed: int,
              greedy: bool) -> list[float]:
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


def _name(env: gym.Env) -> str:
    """The env as the user named it: its registered id, else its class as an entry point (module:Class)."""
    spec, core = env.spec or env.unwrapped.spec, type(env.unwrapped)
    return spec.id if spec is not None else f"{core.__module__}:{core.__qualname__}"
