"""Several policies over one multi-agent env (the run's policy map): the joint sampler, and whole episodes.

Each policy's :class:`~dppo.rl.sampler.Sampler` acts for its agents' columns (:class:`~dppo.envs.columns.PolicyView`)
and returns its own Segment; :class:`JointSampler` runs their step loops (:meth:`Sampler.steps`) in lockstep and
steps the env once per step with all their actions. :class:`JointPlayers` plays whole evaluation episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from dppo.config import Config
from dppo.envs.columns import ParallelEnvs
from dppo.envs.make import make_parallel_envs, make_vector_env
from dppo.rl.agent import Agent, Weights
from dppo.rl.normalizer import RunningStats
from dppo.rl.sampler import Sampler, actor_seed, env_faults_named
from dppo.rl.segment import Segment
from dppo.rl.transforms import ObsNormalizer

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

POLICY_SEED_OFFSET = 3_001  # each policy's action stream, apart from the others' (the env's is the actor's)


def local_sampler(config: Config, actor_id: int = 0, seed: int | None = None,
                  make_envs: Callable[[Config], VectorEnv] = make_vector_env) -> Sampler | JointSampler:
    """An actor's sampler with its policies in its own process: one policy's Sampler (its vector env made by
    ``make_envs``), or, with a policy map of several policies, the joint sampler of all of them."""
    if len(config.policy_names) > 1:
        return JointSampler(config, actor_id, seed)
    return Sampler(config, actor_id, seed, make_envs=make_envs, policy_name=config.policy_names[0])


def policy_config(config: Config, agents: int) -> Config:
    """The run's config as one policy's sampler sees it: each env copy gives it its own ``agents``' columns."""
    return config.model_copy(update={"env": config.env.model_copy(update={"columns_per_copy": agents})})


class JointSampler:
    """One actor's samplers, one per policy of the map, over one vector of Parallel env copies."""

    def __init__(self, config: Config, actor_id: int = 0, seed: int | None = None) -> None:
        self.config, self.actor_id = config, actor_id
        self.seed = actor_seed(config.run.seed, actor_id) if seed is None else seed
        self.joint = make_parallel_envs(config)
        self.joint.reset(seed=self.seed)  # as a Sampler seeds its own envs
        self.samplers = [
            Sampler(policy_config(config, len(view.group.agents)), actor_id, seed=self.seed + POLICY_SEED_OFFSET * g,
                    make_envs=lambda _config, g=g: self.joint.views[g], policy_name=view.group.name)
            for g, view in enumerate(self.joint.views)]

    @property
    def by_policy(self) -> dict[str, Sampler]:
        return {sampler.policy_name: sampler for sampler in self.samplers}

    def sample(self) -> list[Segment]:
        """One segment per policy, in map order: T steps of every copy."""
        loops = [sampler.steps() for sampler in self.samplers]
        try:
            with env_faults_named(self.config):
                requests = [next(loop) for loop in loops]
                while True:
                    results = self.joint.step([actions for _half, actions in requests])
                    requests, segments = [], []
                    for loop, result in zip(loops, results, strict=True):
                        try:
                            requests.append(loop.send(result))
                        except StopIteration as end:  # every loop ends at the same step: T
                            segments.append(end.value)
                    if segments:
                        return segments
        finally:
            for loop in loops:
                loop.close()

    def close(self) -> None:
        self.joint.close()


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
