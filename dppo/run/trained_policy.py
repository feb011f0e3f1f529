"""A checkpoint's policy acting on raw observations in a user's own loop (:func:`dppo.load`): the pieces `dppo eval`
acts with (:func:`dppo.run.trained.trained_model`, :class:`dppo.rl.agent.Agent`, the frozen observation normalizer),
so an action here is the one `dppo eval` would take.

``act`` takes one observation or a batch (a leading dimension) and answers in kind; a multi-agent policy takes a
dict by agent and answers a dict by agent. A recurrent policy's memory stays on the object, one row per observation
of the batch (per agent), until :meth:`TrainedPolicy.reset`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import gymnasium as gym
import numpy as np

from dppo.config import Config, validate
from dppo.errors import UsageError
from dppo.rl.agent import Agent, export_weights
from dppo.rl.spaces import stack
from dppo.rl.transforms import ObsNormalizer
from dppo.run.trained import TrainedModel, trained_model, trained_policies


@dataclass
class Acting:
    """One policy's networks and the observation statistics it was trained with."""

    agent: Agent
    normalize: ObsNormalizer

    @classmethod
    def of(cls, trained: TrainedModel, spaces: tuple[gym.Space, gym.Space], seed: int | None) -> Acting:
        agent = Agent(*spaces, trained.config.model, seed=seed)
        agent.load(export_weights(trained.model), 0)
        normalize = ObsNormalizer(trained.obs_stats is not None, trained.config.env.obs_clip, agent.obs_spec.vector_dim)
        if trained.obs_stats is not None:
            normalize.stats = trained.obs_stats
        return cls(agent, normalize)

    def act(self, obs: Any, deterministic: bool) -> Any:
        """An action for one observation, or a batch of actions for a batch, as the env's action space holds them."""
        rows = batch_rows(obs, self.agent.obs_space)
        spec = self.agent.obs_spec
        encoded = spec.encode_one(obs) if rows is None else spec.encode(obs)
        actions, _, _ = self.agent.act(self.normalize(encoded), greedy=deterministic)
        env_actions = self.agent.action_spec.to_env(actions)
        return env_actions[0] if rows is None else env_actions


class TrainedPolicy:
    """A trained policy: ``act(obs, deterministic=True)``. ``deterministic`` picks the policy's mode (what `dppo
    eval` and `dppo export` do); False samples as training did. ``seed`` seeds the sampled actions."""

    def __init__(self, checkpoint: dict[str, Any], seed: int | None = None) -> None:
        self.config: Config = validate(checkpoint["config"], warn=False)
        env = self.config.env
        self.multiagent = bool(env.multiagent) and checkpoint.get("league") is None  # self-play: one player's obs
        if self.multiagent and (env.agent_id_in_obs or env.global_state):
            raise UsageError("dppo.load: this policy was trained with env.agent_id_in_obs or env.global_state, whose "
                             "observations dppo builds inside its env wrapper; act() takes the agents' raw "
                             "observations only: evaluate it with `dppo eval`")
        several = checkpoint.get("policies") is not None
        trained = trained_policies(checkpoint) if several else {self.config.policy_names[0]: trained_model(checkpoint)}
        self.policies = {name: Acting.of(part, self._spaces(part), seed) for name, part in trained.items()}

    @staticmethod
    def _spaces(trained: TrainedModel) -> tuple[gym.Space, gym.Space]:
        model = trained.model
        return model.obs_spec.space, model.action_spec.space

    @property
    def observation_space(self) -> gym.Space:
        """The (first) policy's observation space: what one observation of ``act`` is."""
        return next(iter(self.policies.values())).agent.obs_space

    @property
    def action_space(self) -> gym.Space:
        return next(iter(self.policies.values())).agent.action_space

    def act(self, obs: Any, deterministic: bool = True) -> Any:
        """The action for one observation, or the actions (a leading dimension) for a batch of them; a multi-agent
        policy takes ``{agent: observation}`` and answers ``{agent: action}``."""
        if not self.multiagent:
            return next(iter(self.policies.values())).act(obs, deterministic)
        if not isinstance(obs, dict):
            raise UsageError(f"act(): a multi-agent policy ({self.config.env.name}) takes a dict of observations by "
                             f"agent, not a {type(obs).__name__}")
        actions: dict[str, Any] = {}
        for name, agents in self._by_policy(list(obs)).items():
            batch = [obs[agent] for agent in agents]
            space = self.policies[name].agent.obs_space
            chosen = self.policies[name].act(stack(batch, space), deterministic)
            actions.update({agent: chosen[row] for row, agent in enumerate(agents)})
        return {agent: actions[agent] for agent in obs}

    def _by_policy(self, agents: list[str]) -> dict[str, list[str]]:
        """The agents each policy acts for, by the run's policy map (every agent: the one policy without a map)."""
        patterns = self.config.policies
        if not patterns:
            return {self.config.policy_names[0]: agents}
        found: dict[str, list[str]] = {}
        for agent in agents:
            owner = next((name for name, globs in patterns.items() if any(fnmatchcase(agent, g) for g in globs)), None)
            if owner is None:
                raise UsageError(f"act(): agent {agent!r} is mapped to no policy of this run ({', '.join(patterns)}); "
                                 "pass the env's own agents")
            found.setdefault(owner, []).append(agent)
        return found

    def reset(self, done: Any = None) -> None:
        """A recurrent policy's memory starts afresh: every row's (``done`` None), or the rows where ``done`` is true
        (a batch's episodes that ended). Nothing to do for a feed-forward policy."""
        for part in self.policies.values():
            if done is None:
                part.agent.memory = None
            else:
                part.agent.end_episodes(np.asarray(done, bool).reshape(-1))


def leaf(space: gym.Space, obs: Any) -> tuple[gym.Space, Any]:
    """The first leaf of a Dict/Tuple space and the observation's value there."""
    while isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        key = next(iter(space.spaces)) if isinstance(space, gym.spaces.Dict) else 0
        kind = dict if isinstance(space, gym.spaces.Dict) else (tuple, list)
        if not isinstance(obs, kind):
            raise UsageError(f"act(): the observation space is {space}, and the observation is a "
                             f"{type(obs).__name__}; pass one of that space's observations (or a batch of them)")
        try:
            space, obs = space[key], obs[key]
        except (KeyError, IndexError):
            raise UsageError(f"act(): the observation has no {key!r}, which {space} holds") from None
    return space, obs


def batch_rows(obs: Any, space: gym.Space) -> int | None:
    """None when ``obs`` is one observation of ``space``; the batch's rows when it has a leading dimension more."""
    leaf_space, value = leaf(space, obs)
    shape = () if isinstance(leaf_space, gym.spaces.Discrete) else tuple(leaf_space.shape or ())
    dims = np.ndim(value)
    if dims == len(shape):
        return None
    if dims == len(shape) + 1:
        return len(value)
    raise UsageError(f"act(): an observation of shape {np.shape(value)} fits neither the {type(leaf_space).__name__} "
                     f"observation space (one observation of shape {shape}) nor a batch of them (shape (B, "
                     f"{', '.join(map(str, shape))}))")

