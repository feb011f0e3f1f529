"""Whole episodes of a policy in one env (:func:`run_episodes`), or of every policy of a map over one multi-agent
env copy (:class:`JointPlayers`): `dppo eval` and the evaluation actor of a training run both use them, so an
evaluation while training and one from a checkpoint measure the same thing."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from dppo.config import Config
from dppo.config.policies import POLICY_SEED_OFFSET
from dppo.envs.api import old_api, old_step_error
from dppo.envs.columns import ParallelEnvs
from dppo.envs.user_code import EnvLoadError
from dppo.rl.agent import Agent, Weights
from dppo.rl.normalizer import RunningStats
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


class JointPlayers:
    """Every policy's Agent (``runners``, by policy name) and frozen observation normalizer over one env copy,
    playing whole episodes together: ``dppo eval`` and the evaluation actor of a run of several policies (one
    policy plays through :func:`dppo.rl.episodes.run_episodes`)."""

    def __init__(self, joint: ParallelEnvs, config: Config, seed: int | None = None) -> None:
        self.joint = joint
        self.runners = {view.group.name: Agent(view.single_observation_space, view.single_action_space, config.model,
                                               seed=None if seed is None else seed + POLICY_SEED_OFFSET * g)
                       for g, view in enumerate(joint.views)}
        self.normalizers = {name: ObsNormalizer(False, config.env.obs_clip, agent.obs_spec.vector_dim)
                            for name, agent in self.runners.items()}

    def load(self, name: str, weights: Weights, version: int, obs_stats: RunningStats | None) -> None:
        """Policy ``name``'s weights and the observation statistics it was trained with (None: raw observations)."""
        self.runners[name].load(weights, version)
        normalize = self.normalizers[name]
        normalize.enabled = obs_stats is not None and self.runners[name].obs_spec.vector_dim > 0
        if obs_stats is not None:
            normalize.stats = obs_stats

    def episodes(self, episodes: int, seed: int, greedy: bool = True,
                 watch: Callable[[int, bool], None] | None = None) -> tuple[list[float], dict[str, list[float]]]:
        """Raw returns of ``episodes`` episodes, reset with seeds ``seed``, ``seed + 1``, ...: per episode the mean
        over every agent (what training reports), and per policy the mean over its agents. ``watch(episode,
        done)`` is called after each reset and step (``dppo eval --video`` renders a frame there)."""
        watch = watch or (lambda _episode, _done: None)
        views = self.joint.views
        agents = sum(view.num_envs for view in views)
        overall, by_policy = [], {name: [] for name in self.runners}
        for episode in range(episodes):
            self.joint.reset(seed=seed + episode)
            totals, done = [np.zeros(view.num_envs) for view in views], False
            watch(episode, done)
            while not done:
                actions = []
                for g, view in enumerate(views):
                    agent, normalize = self.runners[view.group.name], self.normalizers[view.group.name]
                    action, _, _ = agent.act(normalize(agent.obs_spec.encode(self.joint.batch(g))), greedy=greedy)
                    actions.append(agent.action_spec.to_env(action))
                for total, (_, reward, terminated, truncated, _) in zip(totals, self.joint.step(actions),
                                                                        strict=True):
                    total += reward
                    done = done or bool((terminated | truncated).any())  # the copy's episode ends for every agent
                watch(episode, done)
            for view, total in zip(views, totals, strict=True):
                by_policy[view.group.name].append(float(total.mean()))
            overall.append(float(sum(total.sum() for total in totals)) / agents)
        return overall, by_policy
