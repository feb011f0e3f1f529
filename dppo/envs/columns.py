"""PettingZoo Parallel envs as dppo steps them: E copies of the env, every agent a column of its policy's vector
env.

:class:`ParallelEnvs` holds the copies and steps them with every policy's actions at once. Each policy of the map
(:mod:`dppo.envs.policy_map`; one shared policy by default) sees its agents as the columns of one gymnasium vector
env, :class:`PolicyView`: column ``c`` is agent ``agents[c % M]`` of copy ``c // M`` (M: the policy's agents).
Each view follows what :mod:`dppo.rl.sampler` expects of every vector env: gymnasium's SAME_STEP autoreset, the last
observation of an episode in ``info["final_obs"]``, each agent's own reward, terminated and truncated. With one
policy the view steps the copies itself (:class:`ParallelVectorEnv`); with several, the joint sampler steps
:class:`ParallelEnvs` and each view serves its policy's spaces and first observations.

Agents that leave early (killed, finished) follow "black death", as MAPPO (Yu et al. 2022) and SuperSuit's
``black_death`` do: from the step an agent leaves until its env copy's episode ends, its column sees a padding
observation (zeros, the action mask allowing every action, its agent id when added) and reward 0, and its
actions are dropped. Each view's ``info["active"]`` (after every reset and step) is False where the column's agent
has left, so the sampler can keep those steps out of the losses. Each column's episode is its env copy's episode:
it ends, with the agent's own terminated or truncated, when the last agent of the copy (of any policy) leaves, and
the copy resets. So there is one episode per agent per env episode, its return the agent's own and its length the
env episode's. An agent truncated by its own time limit while its copy goes on is a cut, not a death: that step's
``info["agent_truncated"]`` is True and ``info["final_obs"]`` holds its last observation, so the sampler bootstraps
its last live step from V(final observation) (the time-limit rule of :mod:`dppo.rl.advantages`) while its episode
still ends with the copy's.

A copy whose ``step`` (or ``reset``) raises is recreated alone, as :mod:`dppo.envs.failures` does for a gymnasium
copy: every column of that copy ends its episode there, truncated with reward 0 and its last observation as the
final one, the failure in its info (counted by the sampler, its episodes kept out of returns), and a fresh copy
starts the next episode; the other copies go on.

Our own adapter, not SuperSuit's ``pettingzoo_env_to_vec_env_v1``: that one keeps an episode's last observation
only under ``info["terminal_observation"]`` as Stable-Baselines3 reads it, returns infos as a list, and needs
agents to stay until the end.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from dppo.envs.failures import RESEED_STEP, describe, fresh_copy
from dppo.envs.multiagent import AgentObservations, global_state
from dppo.envs.policy_map import PolicyGroup, policy_groups

if TYPE_CHECKING:
    from pettingzoo import ParallelEnv

# What stepping the copies returns to each policy: its columns' (obs, rewards, terminated, truncated, infos)
StepResult = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class ParallelEnvs:
    """E copies of a Parallel env, stepped with every policy's actions at once (see the module docstring)."""

    def __init__(self, envs: Sequence[ParallelEnv], groups: Sequence[PolicyGroup], name: str,
                 agent_id_in_obs: bool = False, mask_key: str | None = None, with_state: bool = False,
                 make: Callable[[], ParallelEnv] | None = None, reset_tries: int = 0) -> None:
        self.envs, self.groups, self.name = list(envs), list(groups), name
        self.make, self.reset_tries = make, reset_tries  # make: recreates a copy that raised (None: it raises on)
        self.first_seeds: list[int | None] = [None] * len(self.envs)  # each copy's seed at the last seeded reset
        self.recreated = [0] * len(self.envs)
        self.agents = list(self.envs[0].possible_agents)
        state_space = global_state(self.envs[0], name) if with_state else None
        self.with_state = state_space is not None
        self.observations = [AgentObservations(g.observation_space, g.agents, agent_id_in_obs, mask_key, state_space)
                             for g in self.groups]
        self.views = [PolicyView(self, index) for index in range(len(self.groups))]
        self._obs: list[list[Any]] = [[None] * view.num_envs for view in self.views]
        self.reset_infos: list[dict[str, Any]] = [{} for _ in self.groups]
        # per copy: the agents that left its current episode -> (terminated, truncated) when they left
        self._left: list[dict[str, tuple[bool, bool]]] = [{} for _ in self.envs]

    def reset(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
              ) -> list[dict[str, Any]]:
        """Reset every copy (copy i seeded ``seed + i``, as gymnasium's vector envs do); each policy's infos."""
        if seed is None or isinstance(seed, int):
            seed = [None if seed is None else seed + i for i in range(len(self.envs))]
        infos: list[dict[str, Any]] = [{} for _ in self.groups]
        self.first_seeds, self.recreated = list(seed), [0] * len(self.envs)
        for copy, (env, copy_seed) in enumerate(zip(self.envs, seed, strict=True)):
            obs, info = env.reset(seed=copy_seed, options=options)
            self._start_episode(copy, obs, info, infos)
        self._add_active(infos)
        self.reset_infos = infos
        return infos

    def _start_episode(self, copy: int, obs: dict[str, Any], info: dict[str, Any],
                       infos: list[dict[str, Any]]) -> None:
        self._left[copy] = {}
        state = self.state_of(copy)
        for g, group in enumerate(self.groups):
            for i, agent in enumerate(group.agents):
                column = copy * len(group.agents) + i
                self._obs[g][column] = self.observations[g].of(obs, i, state)
                infos[g] = self.views[g]._add_info(infos[g], info.get(agent, {}), column)

    def step(self, actions: Sequence[Any]) -> list[StepResult]:
        """One step of every copy; ``actions[g]``: policy g's batched actions, one per column."""
        per_column = [list(iterate(view.action_space, part)) for view, part in zip(self.views, actions, strict=True)]
        rewards = [np.zeros(view.num_envs, np.float64) for view in self.views]
        terminated = [np.zeros(view.num_envs, bool) for view in self.views]
        truncated = [np.zeros(view.num_envs, bool) for view in self.views]
        infos: list[dict[str, Any]] = [{} for _ in self.groups]
        for copy, env in enumerate(self.envs):
            self._step_copy(copy, env, per_column, rewards, terminated, truncated, infos)
        self._add_active(infos)
        return [(self.batch(g), rewards[g], terminated[g], truncated[g], infos[g]) for g in range(len(self.groups))]

    def _add_active(self, infos: list[dict[str, Any]]) -> None:
        """``info["active"]`` of every policy: its columns whose agent acts at the next step (False: it has left
        its copy's episode, or is absent from it, and its column sees padding until the copy resets)."""
        acting = [set(env.agents).difference(left) for env, left in zip(self.envs, self._left, strict=True)]
        for g, group in enumerate(self.groups):
            active = np.array([agent in live for live in acting for agent in group.agents], bool)
            infos[g]["active"], infos[g]["_active"] = active, np.ones_like(active)

    def _columns(self, copy: int) -> list[tuple[int, int, int, str]]:
        """(policy, index among its agents, column, agent) of every agent of one copy."""
        return [(g, i, copy * len(group.agents) + i, agent) for g, group in enumerate(self.groups)
                for i, agent in enumerate(group.agents)]

    def _step_copy(self, copy: int, env: ParallelEnv, actions: list[list[Any]], rewards: list[np.ndarray],
                   terminated: list[np.ndarray], truncated: list[np.ndarray], infos: list[dict[str, Any]]) -> None:
        """Step one copy, writing its columns; reset it when its last agent has left."""
        left, columns = self._left[copy], self._columns(copy)
        acting = {agent: actions[g][column] for g, _, column, agent in columns
                  if agent in env.agents and agent not in left}
        try:
            obs, reward, term, trunc, info = env.step(acting)
        except Exception as err:
            if self.make is None:
                raise
            self._fail(copy, (describe(err), traceback.format_exc()), terminated, truncated, infos)
            return
        state = self.state_of(copy)
        for g, i, column, agent in columns:
            if agent in acting:
                rewards[g][column] = reward.get(agent, 0.0)
                self._obs[g][column] = self.observations[g].of(obs, i, state)
                if term.get(agent, False) or trunc.get(agent, False):
                    left[agent] = (bool(term.get(agent, False)), bool(trunc.get(agent, False)))
        over = not env.agents or all(agent in left for agent in self.agents)
        for g, i, column, agent in columns:
            view = self.views[g]
            if not over:
                if agent in acting and left.get(agent) == (False, True):  # its own time limit: bootstrap from here
                    cut = {"final_obs": self._obs[g][column], "agent_truncated": True}
                    infos[g] = view._add_info(infos[g], cut, column)
                if agent in left:  # black death until the copy's episode ends
                    self._obs[g][column] = self.observations[g].padding(i, state)
                infos[g] = view._add_info(infos[g], info.get(agent, {}), column)
                continue
            # an agent that never reported why it left (absent all episode) ends as terminated: no bootstrap
            terminated[g][column], truncated[g][column] = left.get(agent, (True, False))
            final = {"final_obs": self._obs[g][column], "final_info": info.get(agent, {})}
            infos[g] = view._add_info(infos[g], final, column)
        if over:
            try:
                obs, info = env.reset()
            except Exception as err:
                if self.make is None:
                    raise
                self._fail(copy, (describe(err), traceback.format_exc()), terminated, truncated, infos)
                return
            self._start_episode(copy, obs, info, infos)

    def _fail(self, copy: int, failure: tuple[str, str], terminated: list[np.ndarray], truncated: list[np.ndarray],
              infos: list[dict[str, Any]]) -> None:
        """Copy ``copy`` raised: its columns' episodes cut (truncated at their last observation, the failure in
        their info), and a fresh copy started."""
        line, details = failure
        for g, _, column, _ in self._columns(copy):
            terminated[g][column], truncated[g][column] = False, True
            cut = {"final_obs": self._obs[g][column], "env_failure": line, "env_failure_traceback": details}
            infos[g] = self.views[g]._add_info(infos[g], cut, column)
        def start(env: ParallelEnv) -> tuple[dict[str, Any], dict[str, Any]]:
            self.recreated[copy] += 1
            first = self.first_seeds[copy]
            return env.reset(seed=None if first is None else first + RESEED_STEP * self.recreated[copy])

        self.envs[copy], (obs, info) = fresh_copy(self.make, start, self.name, self.reset_tries, self.envs[copy])
        self._start_episode(copy, obs, info, infos)

    def state_of(self, copy: int) -> np.ndarray | None:
        """Copy ``copy``'s global state now (env.global_state), else None."""
        return np.asarray(self.envs[copy].state(), np.float32) if self.with_state else None

    def batch(self, g: int) -> Any:
        """Policy g's latest observations, batched."""
        space = self.views[g].single_observation_space
        return concatenate(space, self._obs[g], create_empty_array(space, self.views[g].num_envs))

    def render(self) -> tuple[Any, ...]:
        return tuple(env.render() for env in self.envs)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class PolicyView(VectorEnv):
    """One policy's columns of :class:`ParallelEnvs` as a gymnasium vector env. With one policy it resets and steps
    the copies itself; with several, their owner (the joint sampler) does, and ``reset`` returns what the last
    reset or step left for this policy."""

    def __init__(self, joint: ParallelEnvs, index: int) -> None:
        self.joint, self.index = joint, index
        self.group = joint.groups[index]
        self.num_envs = len(joint.envs) * len(self.group.agents)
        self.single_observation_space = joint.observations[index].space
        self.single_action_space = self.group.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {**getattr(joint.envs[0], "metadata", {}), "autoreset_mode": AutoresetMode.SAME_STEP}
        self.render_mode = getattr(joint.envs[0], "render_mode", None)

    @property
    def envs(self) -> list[ParallelEnv]:
        """The Parallel env copies."""
        return self.joint.envs

    @property
    def alone(self) -> bool:
        """This view's policy is the only one: the view steps the copies."""
        return len(self.joint.groups) == 1

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed if isinstance(seed, int) else None)
        if self.alone:
            self.joint.reset(seed, options)
        return self.joint.batch(self.index), self.joint.reset_infos[self.index]

    def step(self, actions: Any) -> StepResult:
        if not self.alone:
            raise RuntimeError("one policy's columns cannot step the env alone: ParallelEnvs.step takes every "
                               "policy's actions")
        return self.joint.step([actions])[0]

    def render(self) -> tuple[Any, ...] | None:
        return self.joint.render() if self.render_mode is not None else None

    def close_extras(self, **kwargs: Any) -> None:
        if self.alone:
            self.joint.close()


class ParallelVectorEnv(PolicyView):
    """E copies of a Parallel env as one vector env of E x M columns, one policy acting for every agent."""

    def __init__(self, envs: Sequence[ParallelEnv], name: str, agent_id_in_obs: bool = False,
                 mask_key: str | None = None, with_state: bool = False) -> None:
        groups = policy_groups(envs[0], {}, name)
        super().__init__(ParallelEnvs(envs, groups, name, agent_id_in_obs, mask_key, with_state), 0)
