"""PettingZoo Parallel envs as dppo steps them: every agent is a column of the actor's vector env, and one policy,
shared by all agents, acts for every column (parameter sharing: IPPO, the default of issue 36).

Column ``c`` of :class:`ParallelVectorEnv` is agent ``possible_agents[c % M]`` of env copy ``c // M``. The vector
env follows what :mod:`dppo.rl.sampler` expects of every vector env: gymnasium's SAME_STEP autoreset, the last
observation of an episode in ``info["final_obs"]``, each agent's own reward, terminated and truncated.

Agents that leave early (killed, finished) follow "black death", as MAPPO (Yu et al. 2022) and SuperSuit's
``black_death`` do: from the step an agent leaves until its env copy's episode ends, its column sees a padding
observation (zeros, the action mask allowing every action, its agent id when added) and reward 0, and its
actions are dropped. Each column's episode is its env copy's episode: it ends, with the agent's own terminated or
truncated, when the last agent leaves, and the copy resets. So there is one episode per agent per env episode,
its return the agent's own (the reported mean is per agent) and its length the env episode's.

Our own adapter, not SuperSuit's ``pettingzoo_env_to_vec_env_v1``: that one keeps an episode's last observation
only under ``info["terminal_observation"]`` as Stable-Baselines3 reads it, returns infos as a list, and needs
agents to stay until the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from dppo.config.env import GLOBAL_STATE_KEY
from dppo.errors import UsageError

if TYPE_CHECKING:
    from pettingzoo import ParallelEnv

AGENT_ID_KEY = "agent_id"
OBS_KEY = "observation"  # the observation's key when an agent id or the state is added to a non-Dict observation


def shared_spaces(env: ParallelEnv, name: str) -> tuple[gym.Space, gym.Space]:
    """The observation and action space every agent has, or UsageError: one shared policy needs one space."""
    agents = list(env.possible_agents)
    if not agents:
        raise UsageError(f"env {name!r} has no possible_agents; a PettingZoo Parallel env lists its agents there")
    first = agents[0]
    obs_space, action_space = env.observation_space(first), env.action_space(first)
    for agent in agents[1:]:
        spaces = env.observation_space(agent), env.action_space(agent)
        if spaces != (obs_space, action_space):
            raise UsageError(
                f"env {name!r}: agents {first!r} ({obs_space}, {action_space}) and {agent!r} ({spaces[0]}, "
                f"{spaces[1]}) have different spaces; agents with different spaces need separate policies (not "
                "supported yet; issue 36): pad them to one, e.g. env.wrappers: [supersuit:pad_observations_v0, "
                "supersuit:pad_action_space_v0]")
    return obs_space, action_space


def check_columns(num_envs: int, num_agents: int, name: str) -> int:
    """The env copies an actor runs: env.num_envs counts columns, one per agent, so it must hold whole copies."""
    if num_envs % num_agents:
        raise UsageError(
            f"env.num_envs {num_envs} is not a multiple of the {num_agents} agents of {name!r}: each agent is a "
            f"column of the actor's vector env; set env.num_envs (--envs-per-actor) to {num_agents} x the env copies "
            f"you want, e.g. {num_agents * max(1, num_envs // num_agents)}")
    return num_envs // num_agents


class AgentObservations:
    """Each agent's observation as the shared policy sees it: optionally with the agent's index, one-hot
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


class ParallelVectorEnv(VectorEnv):
    """E copies of a PettingZoo Parallel env, E x M columns (see the module docstring)."""

    def __init__(self, envs: Sequence[ParallelEnv], name: str, agent_id_in_obs: bool = False,
                 mask_key: str | None = None, with_state: bool = False) -> None:
        self.envs = list(envs)
        self.agents = list(self.envs[0].possible_agents)
        obs_space, action_space = shared_spaces(self.envs[0], name)
        state_space = global_state(self.envs[0], name) if with_state else None
        self.observations = AgentObservations(obs_space, self.agents, agent_id_in_obs, mask_key, state_space)
        self.num_envs = len(self.envs) * len(self.agents)
        self.single_observation_space, self.single_action_space = self.observations.space, action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(action_space, self.num_envs)
        self.metadata = {**getattr(self.envs[0], "metadata", {}), "autoreset_mode": AutoresetMode.SAME_STEP}
        self.render_mode = getattr(self.envs[0], "render_mode", None)
        self._obs: list[Any] = [None] * self.num_envs
        # per copy: the agents that left its current episode -> (terminated, truncated) when they left
        self._left: list[dict[str, tuple[bool, bool]]] = [{} for _ in self.envs]

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed if isinstance(seed, int) else None)
        if seed is None or isinstance(seed, int):  # as gymnasium's vector envs: copy i gets seed + i
            seed = [None if seed is None else seed + i for i in range(len(self.envs))]
        infos: dict[str, Any] = {}
        for copy, (env, copy_seed) in enumerate(zip(self.envs, seed, strict=True)):
            obs, info = env.reset(seed=copy_seed, options=options)
            infos = self._start_episode(copy, obs, info, infos)
        return self._batch(), infos

    def _start_episode(self, copy: int, obs: dict[str, Any], info: dict[str, Any],
                       infos: dict[str, Any]) -> dict[str, Any]:
        self._left[copy] = {}
        state = self._state(copy)
        for i, agent in enumerate(self.agents):
            column = copy * len(self.agents) + i
            self._obs[column] = self.observations.of(obs, i, state)
            infos = self._add_info(infos, info.get(agent, {}), column)
        return infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = list(iterate(self.action_space, actions))
        rewards = np.zeros(self.num_envs, np.float64)
        terminated, truncated = np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        infos: dict[str, Any] = {}
        for copy, env in enumerate(self.envs):
            infos = self._step_copy(copy, env, actions, rewards, terminated, truncated, infos)
        return self._batch(), rewards, terminated, truncated, infos

    def _step_copy(self, copy: int, env: ParallelEnv, actions: list[Any], rewards: np.ndarray,
                   terminated: np.ndarray, truncated: np.ndarray, infos: dict[str, Any]) -> dict[str, Any]:
        """Step one copy, writing its columns; reset it when its last agent has left."""
        base, left = copy * len(self.agents), self._left[copy]
        acting = {agent: actions[base + i] for i, agent in enumerate(self.agents)
                  if agent in env.agents and agent not in left}
        obs, reward, term, trunc, info = env.step(acting)
        state = self._state(copy)
        for i, agent in enumerate(self.agents):
            if agent in acting:
                rewards[base + i] = reward.get(agent, 0.0)
                self._obs[base + i] = self.observations.of(obs, i, state)
                if term.get(agent, False) or trunc.get(agent, False):
                    left[agent] = (bool(term.get(agent, False)), bool(trunc.get(agent, False)))
        over = not env.agents or all(agent in left for agent in self.agents)
        for i, agent in enumerate(self.agents):
            column = base + i
            if not over:
                if agent in left:  # black death until the copy's episode ends
                    self._obs[column] = self.observations.padding(i, state)
                infos = self._add_info(infos, info.get(agent, {}), column)
                continue
            # an agent that never reported why it left (absent all episode) ends as terminated: no bootstrap
            terminated[column], truncated[column] = left.get(agent, (True, False))
            infos = self._add_info(infos, {"final_obs": self._obs[column], "final_info": info.get(agent, {})}, column)
        if over:
            obs, info = env.reset()
            infos = self._start_episode(copy, obs, info, infos)
        return infos

    def _state(self, copy: int) -> np.ndarray | None:
        """Copy ``copy``'s global state now (env.global_state), else None."""
        return np.asarray(self.envs[copy].state(), np.float32) if self.observations.with_state else None

    def _batch(self) -> Any:
        return concatenate(self.single_observation_space, self._obs,
                           create_empty_array(self.single_observation_space, self.num_envs))

    def render(self) -> tuple[Any, ...] | None:
        return tuple(env.render() for env in self.envs) if self.render_mode is not None else None

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


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
        obs_space, self.action_space = shared_spaces(env, name)
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
