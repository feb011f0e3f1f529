"""Greedy evaluation of a checkpoint: the policy's mode, normalized exactly as in training."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from dppo.config import Config
from dppo.envs.make import make_env
from dppo.errors import UsageError
from dppo.rl.agent import Agent, export_weights
from dppo.rl.normalizer import RunningStats


def make_eval_env(config: Config, video_dir: str | None) -> gym.Env:
    if video_dir is None:
        return make_env(config.env)
    try:
        import moviepy  # noqa: F401 - RecordVideo needs it
    except ImportError:
        raise UsageError("--video needs moviepy: pip install moviepy") from None
    env = make_env(config.env, render_mode="rgb_array")
    return gym.wrappers.RecordVideo(env, video_dir, episode_trigger=lambda _: True, disable_logger=True)


def evaluate(config: Config, state: dict[str, Any], episodes: int, seed: int, video_dir: str | None = None
             ) -> list[float]:
    """Raw returns of ``episodes`` greedy episodes, seeds ``seed``, ``seed + 1``, ..."""
    env = make_eval_env(config, video_dir)
    agent = Agent(env.observation_space, env.action_space, config.model)
    try:
        agent.model.load_state_dict(state["model"])
    except RuntimeError as err:
        raise UsageError(f"checkpoint does not match env {config.env.name} ({str(err).splitlines()[0]})") from None
    agent.load(export_weights(agent.model), 0)
    obs_stats = RunningStats.from_state(state["obs_stats"]) if state.get("obs_stats") else None
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            total, done = 0.0, False
            while not done:
                policy_obs = agent.obs_spec.encode_one(obs)
                if obs_stats is not None and policy_obs.vector is not None:
                    policy_obs.vector[:] = obs_stats.normalize(policy_obs.vector, config.env.obs_clip)
                action, _, _ = agent.act(policy_obs, greedy=True)
                action = agent.action_spec.to_env(action)[0]
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns
