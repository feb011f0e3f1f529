"""Greedy evaluation of a checkpoint: the policy's mode, normalized exactly as in training."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from dppo.config import Config
from dppo.errors import UsageError
from dppo.rl.agent import Agent, export_weights
from dppo.rl.normalizer import RunningStats


def make_eval_env(config: Config, video_dir: str | None) -> gym.Env:
    if video_dir is None:
        return gym.make(config.env.id, **config.env.kwargs)
    try:
        import moviepy  # noqa: F401 - RecordVideo needs it
    except ImportError:
        raise UsageError("--video needs moviepy: pip install moviepy") from None
    env = gym.make(config.env.id, render_mode="rgb_array", **config.env.kwargs)
    return gym.wrappers.RecordVideo(env, video_dir, episode_trigger=lambda _: True, disable_logger=True)


def evaluate(config: Config, state: dict[str, Any], episodes: int, seed: int, video_dir: str | None = None
             ) -> list[float]:
    """Raw returns of ``episodes`` greedy episodes, seeds ``seed``, ``seed + 1``, ..."""
    env = make_eval_env(config, video_dir)
    agent = Agent(env.observation_space, env.action_space, config.model)
    try:
        agent.model.load_state_dict(state["model"])
    except RuntimeError as err:
        raise UsageError(f"checkpoint does not match env {config.env.id} ({str(err).splitlines()[0]})") from None
    agent.load(export_weights(agent.model), 0)
    obs_stats = RunningStats.from_state(state["obs_stats"]) if state.get("obs_stats") else None
    box = isinstance(env.action_space, gym.spaces.Box)
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            total, done = 0.0, False
            while not done:
                policy_obs = obs_stats.normalize(obs, config.env.obs_clip) if obs_stats else obs
                action, _, _ = agent.act(np.asarray(policy_obs)[None], greedy=True)
                action = np.clip(action[0], env.action_space.low, env.action_space.high) if box else int(action[0])
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns
