"""What every agent of a PettingZoo Parallel env sees, and the one-env view that ``dppo eval`` plays.

:class:`AgentObservations` is each agent's observation as its policy sees it (its index and the env's global state
added on request, the padding of an agent that left); the vector envs of the actors are in :mod:`dppo.envs.columns`.
:class:`AgentTurns` plays one copy with its agents in turns, for one policy shared by all agents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import create_empty_array, iterate

from dppo.config.env import GLOBAL_STATE_KEY
from dppo.envs.policy_map import policy_groups
from dppo.errors import UsageError

if TYPE_CHECKING:
    from pettingzoo import ParallelEnv

AGENT_ID_KEY = "agent_id"
OBS_KEY = "observation"  # the observation's key when an agent id or the state is added to a non-Dict observation


class AgentObservations:
    """Each agent's observation as its policy sees it: optionally with the agent's index, one-hot
    (env.agent_id_in_obs: the policy can tell roles apart) and the env's global state (env.global_state: for the
    critic alone, MAPPO), and the padding observation of an agent that left (its own part zeros, the rest kept)."""

    def __init__(self, space: gym.Space, agents: Sequence[str], add_id: bool, mask_key: str | None,
                 state_space: gym.Space | None = None) -> None:
        self.agents, self.add_id, self.with_state = list(agents), add_id, state_space is not None
        extras = {AGENT_ID_KEY: gym.spaces.Box(0.0, 1.0, (len(self.agents),), np.float32)} if add_id else {}
        if state_space is not None:
            extras[GLOBAL_STATE_KEY] = state_space
        self.space = self._extended(space, extras)
        self.own_padding = self._padding(space, mask_key)

    @staticmethod
    def _extended(space: gym.Space, extras: dict[str, gym.Space]) -> gym.Space:
        if not extras:
            return space
        if not isinstance(space, gym.spaces.Dict):
            return gym.spaces.Dict({OBS_KEY: space, **extras})
        for key in extras:
            if key in space.spaces:
                flag = "agent_id_in_obs" if key == AGENT_ID_KEY else "global_state"
                raise UsageError(f"env.{flag} adds the key {key!r}, which the observation already has; set "
                                 f"env.{flag} to false")
        return gym.spaces.Dict({**space.spaces, **extras})

    @staticmethod
    def _padding(space: gym.Space, mask_key: str | None) -> Any:
        """Zeros; an action mask that allows every action (a mask allowing none stops the sampler)."""
        obs = next(iter(iterate(space, create_empty_array(space, 1, fn=np.zeros))))
        if isinstance(space, gym.spaces.Dict) and mask_key in space.spaces:
            obs[mask_key] = np.ones_like(obs[mask_key])
        return obs

    def observe(self, obs: Any, index: int, state: np.ndarray | None = None) -> Any:
        extras: dict[str, Any] = {}
        if self.add_id:
            extras[AGENT_ID_KEY] = np.eye(len(self.agents), dtype=np.float32)[index]
        if self.with_state:
            extras[GLOBAL_STATE_KEY] = state
        if not extras:
            return obs
        return {**obs, **extras} if isinstance(obs, dict) else {OBS_KEY: obs, **extras}

    def padding(self, index: int, state: np.ndarray | None = None) -> Any:
        return self.observe(self.own_padding, index, state)

    def of(self, observations: dict[str, Any], index: int, state: np.ndarray | None = None) -> Any:
        """Agent ``index``'s observation in an env's dict of them, or its padding when it has none."""
        agent = self.agents[index]
        return self.observe(observations[agent], index, state) if agent in observations else self.padding(index, state)


def global_state(env: ParallelEnv, name: str) -> gym.Space:
    """The env's state space (env.global_state), or UsageError when it has no state()."""
    space = getattr(env, "state_space", None)
    if not callable(getattr(env, "state", None)) or not isinstance(space, gym.Space):
        raise UsageError(f"env.global_state: env {name!r} has no state() and state_space (PettingZoo's global state); "
                         "set env.global_state to false, or give the env both")
    return space


class AgentTurns(gym.Env):
    """One copy of a Parallel env as one gymnasium Env that takes its live agents' actions one at a time, as
    PettingZoo's AEC view of a parallel env does: ``dppo eval``, the evaluation actor and the start check play it
    with the shared policy. Each ``step`` takes the action of the agent whose observation was returned last; the
    env steps after the last live agent's. The reward of that step is the agents' rewards summed and divided by
    the number of agents, so an episode's return is the mean of the agents' returns: what training reports.

    A recurrent policy would carry one memory through all agents' turns: refused with multi-agent envs for now.
    Video frames repeat once per agent; ``render_fps`` is scaled by the number of agents so videos keep time."""

    def __init__(self, env: ParallelEnv, name: str, agent_id_in_obs: bool = False, with_state: bool = False) -> None:
        self.env = env
        self.agents = list(env.possible_agents)
        group = policy_groups(env, {}, name)[0]
        obs_space, self.action_space = group.observation_space, group.action_space
        state_space = global_state(env, name) if with_state else None
        self.observations = AgentObservations(obs_space, self.agents, agent_id_in_obs, None, state_space)
        self.observation_space = self.observations.space
        self.num_agents = len(self.agents)
        metadata = dict(getattr(env, "metadata", {}))
        if "render_fps" in metadata:
            metadata["render_fps"] = metadata["render_fps"] * self.num_agents
        self.metadata = metadata
        self.render_mode = getattr(env, "render_mode", None)
        self._obs: dict[str, Any] = {}
        self._round: list[str] = []
        self._actions: dict[str, Any] = {}
        self._left: set[str] = set()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._obs, info = self.env.reset(seed=seed, options=options)
        self._left = set()
        self._start_round()
        return self._current(), info.get(self._round[0], {}) if self._round else {}

    def _start_round(self) -> None:
        live = set(self.env.agents) - self._left
        self._round, self._actions = [agent for agent in self.agents if agent in live], {}

    def _current(self) -> Any:
        """The observation of the agent whose turn it is (after the episode: the first agent's last one)."""
        agent = self._round[len(self._actions)] if self._round else self.agents[0]
        state = np.asarray(self.env.state(), np.float32) if self.observations.with_state else None
        return self.observations.of(self._obs, self.agents.index(agent), state)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._actions[self._round[len(self._actions)]] = action
        if len(self._actions) < len(self._round):
            return self._current(), 0.0, False, False, {}
        obs, rewards, term, trunc, _ = self.env.step(self._actions)
        self._obs = {**self._obs, **obs}
        reward = float(sum(rewards.values())) / self.num_agents
        ended = [agent for agent in self._actions if term.get(agent, False) or trunc.get(agent, False)]
        self._left.update(ended)
        self._start_round()
        if self._round:
            return self._current(), reward, False, False, {}
        truncated = any(trunc.get(agent, False) and not term.get(agent, False) for agent in ended)
        return self._current(), reward, not truncated, truncated, {}

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
