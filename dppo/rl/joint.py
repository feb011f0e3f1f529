"""Several policies over one multi-agent env (the run's policy map): the joint sampler.

Each policy's :class:`~dppo.rl.sampler.Sampler` acts for its agents' columns (:class:`~dppo.envs.columns.PolicyView`)
and returns its own Segment; :class:`JointSampler` runs their step loops (:meth:`Sampler.steps`) in lockstep and
steps the env once per step with all their actions. Whole evaluation episodes of several policies:
:class:`dppo.rl.episodes.JointPlayers`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dppo.config import Config
from dppo.config.policies import POLICY_SEED_OFFSET
from dppo.envs.make import make_parallel_envs, make_vector_env
from dppo.rl.sampler import Sampler, actor_seed, env_faults_named
from dppo.rl.segment import Segment

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv


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
