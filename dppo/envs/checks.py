"""The env check at start: one env made, reset and stepped in the driver, as every actor will, so an env that
cannot run is bad input (exit 2, one line) before Ray starts and before anything is written.

gymnasium's passive checker (which gym.make and dppo's entry points add) names some mistakes and only warns
about others; what it lets through would fail later inside an actor's vector env with a message about
numpy casting. So the shape of what ``reset()`` and ``step()`` return is checked here too, leaf by leaf,
naming the leaf: ``obs['pos']: ...``. Values are not checked against a Box's bounds (training does not use
them, and many envs step slightly outside them).

An env written for the old gym API (``reset() -> obs``, ``step() -> (obs, reward, done, info)``) fails inside
gymnasium's wrappers with an unpack error that does not say why; it is named as the old API, with the fix, here
(the check at start), in an actor (:mod:`dppo.rl.sampler`) and in the episode loop of ``dppo eval``.
"""

from __future__ import annotations

import contextlib
import numbers
import warnings
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from dppo.envs.api import API, PARALLEL_API, old_api, parallel_problem, result_problem
from dppo.envs.make import make_env, make_parallel_envs, make_pettingzoo_env
from dppo.envs.multiagent import AgentTurns
from dppo.envs.user_code import EnvLoadError
from dppo.errors import OneLineWarning, UsageError, first_line

if TYPE_CHECKING:
    from dppo.config import Config, EnvConfig

API_STEPS = 200  # steps (over resets) of the Parallel API check at start: a few episodes of most envs, about 0.1 s

def check_env(config: Config) -> dict[str, tuple[gym.Space, gym.Space, Any]]:
    """Make one env, reset it, take one step: each policy's spaces and first observation (one policy without a
    policy map), or EnvLoadError naming the env, the call and the fix."""
    if config.env.kind == "parallel":
        check_parallel_api(config)
    if config.policies:
        return check_mapped_env(config)
    return {config.policy_names[0]: check_one_env(config)}


def check_parallel_api(config: Config, steps: int = API_STEPS) -> None:
    """A few episodes of the Parallel env with random actions, checking the points of PettingZoo's own
    ``parallel_api_test`` that training relies on. What breaks training is an EnvLoadError (an agent outside
    ``possible_agents``, a live agent without an observation); what dppo can train through is one warning line (an
    agent kept in ``agents`` after it terminated or truncated, or back after it left: dppo pads its column until
    the episode ends)."""
    env, name = make_pettingzoo_env(config.env), config.env.name
    said: set[str] = set()
    try:
        obs, _ = env.reset(seed=config.run.seed)
        finished: set[str] = set()  # agents that terminated or truncated this episode
        gone: set[str] = set()  # of those, the ones that have left env.agents
        for _ in range(steps):
            for agent in env.agents:
                if agent not in env.possible_agents:
                    raise EnvLoadError(f"env {name!r}: agent {agent!r} is in agents but not in possible_agents; "
                                       f"list every agent that can appear in possible_agents ({PARALLEL_API})")
                if agent not in obs and agent not in finished:
                    raise EnvLoadError(f"env {name!r}: live agent {agent!r} got no observation; return one for "
                                       f"every agent in agents ({PARALLEL_API})")
            live = [agent for agent in env.agents if agent not in finished]
            actions = {agent: random_action(env, obs.get(agent), agent, config.model.action_mask_key)
                       for agent in live}
            obs, _, terminated, truncated, _ = env.step(actions)
            ended = {agent for agent in live if terminated.get(agent) or truncated.get(agent)}
            for bend, agents, what in (
                    ("kept", ended & set(env.agents), "keeps agent {} in agents after it terminated or truncated, "
                     "where PettingZoo's Parallel API removes it"),
                    ("back", gone & set(env.agents), "brings agent {} back after it terminated or truncated, where "
                     "PettingZoo's Parallel API lets no agent that left return")):
                if agents and bend not in said:
                    said.add(bend)
                    warnings.warn(f"env {name!r} {what.format(repr(sorted(agents)[0]))}; dppo pads its column until "
                                  "the episode ends (pettingzoo.test.parallel_api_test shows the rest)",
                                  OneLineWarning, stacklevel=2)
            finished |= ended
            gone |= finished - set(env.agents)
            if not env.agents or set(env.agents) <= finished:
                obs, _ = env.reset()
                finished, gone = set(), set()
    except EnvLoadError:
        raise
    except Exception:  # the env raised: the check of its reset and step that follows names it
        return
    finally:
        with contextlib.suppress(Exception):
            env.close()


def random_action(env: Any, obs: Any, agent: str, mask_key: str | None) -> Any:
    """A random action of ``agent``, within the action mask its observation carries (as parallel_api_test draws)."""
    space = env.action_space(agent)
    if mask_key and isinstance(obs, dict) and mask_key in obs:
        return space.sample(mask=np.asarray(obs[mask_key], np.int8))
    return space.sample()


def check_one_env(config: Config) -> tuple[gym.Space, gym.Space, Any]:
    """:func:`check_env` of a run of one policy: its spaces and first observation."""
    env = make_env(config.env)
    name = config.env.name
    try:
        if isinstance(env, AgentTurns):
            check_multiagent(config)
        space = env.observation_space
        first = None
        for call, run, size in (("reset()", lambda: env.reset(seed=config.run.seed), 2),
                                ("step()", lambda: env.step(env.action_space.sample()), 5)):
            try:
                result = run()
            except Exception as err:
                old = old_api(env, config.run.seed)
                raise EnvLoadError(f"env {name!r}: {old}" if old else f"env {name!r}: {call} raised "
                                   f"{type(err).__name__}: {first_line(err)}; fix the env ({API})") from None
            problem = result_problem(result, size, space)
            if problem is not None:
                old = old_api(env, config.run.seed)
                raise EnvLoadError(f"env {name!r}: {old}" if old else f"env {name!r}: {call} returned {problem}; "
                                   f"fix the env ({API})")
            first = result[0] if first is None else first
            check_info(result[-1], config)
        return space, env.action_space, first
    finally:
        with contextlib.suppress(Exception):
            env.close()


def check_info(info: Any, config: Config) -> None:
    """metrics.info_keys that reset() or step() already set hold numbers or booleans (one line naming the key)."""
    if isinstance(info, dict):
        for key in config.metrics.info_keys:
            if key in info:
                info_number(key, info[key], config.env.name)


def info_number(key: str, value: Any, env_name: str) -> float:
    """An info entry of metrics.info_keys as a float, or one line naming the key: only numbers and booleans average
    (dppo.rl.env_info averages them)."""
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    if isinstance(value, (bool, np.bool_, numbers.Real)):
        return float(value)
    raise UsageError(f"env {env_name!r} info[{key!r}] is {type(value).__name__} {str(value)[:60]!r}, and "
                     "metrics.info_keys averages numbers and booleans; drop the key from metrics.info_keys or make "
                     "the env put a number there")


def check_mapped_env(config: Config) -> dict[str, tuple[gym.Space, gym.Space, Any]]:
    """:func:`check_env` of a Parallel env with a policy map: the map resolved against the env's agents (each agent
    one policy, a policy's agents one space), then the env's own reset() and one step() with every live agent's
    random action, each agent's observation checked against its space. Each policy's spaces (as its network sees
    them) and its first agent's first observation."""
    joint = make_parallel_envs(config, copies=1)
    name, env = config.env.name, joint.envs[0]
    check_multiagent(config)
    spaces = {agent: group.observation_space for group in joint.groups for agent in group.agents}
    actions = {agent: group.action_space for group in joint.groups for agent in group.agents}
    try:
        first = None
        for call, run in (("reset()", lambda: env.reset(seed=config.run.seed)),
                          ("step()", lambda: env.step({a: actions[a].sample() for a in env.agents}))):
            try:
                result = run()
            except Exception as err:
                raise EnvLoadError(f"env {name!r}: {call} raised {type(err).__name__}: {first_line(err)}; fix the "
                                   f"env ({PARALLEL_API})") from None
            problem = parallel_problem(result, 2 if first is None else 5, spaces)
            if problem is not None:
                raise EnvLoadError(f"env {name!r}: {call} returned {problem}; fix the env ({PARALLEL_API})")
            first = result[0] if first is None else first
        checked = {}
        for g, (group, view) in enumerate(zip(joint.groups, joint.views, strict=True)):
            obs = joint.observations[g].of(first, 0, joint.state_of(0))
            checked[group.name] = (view.single_observation_space, view.single_action_space, obs)
        return checked
    finally:
        with contextlib.suppress(Exception):
            joint.close()


def check_multiagent(config: Config) -> None:
    """What a multi-agent env needs of the rest of the config: a memoryless policy."""
    if config.model.recurrent != "none":
        raise EnvLoadError(f"model.recurrent {config.model.recurrent!r} with the multi-agent env {config.env.name!r} "
                           "is not supported yet: evaluation plays the agents in turns through one memory; "
                           "set model.recurrent: none (env.agent_id_in_obs tells agents apart)")


def old_api_error(cfg: EnvConfig, seed: int | None = None) -> EnvLoadError | None:
    """:func:`old_api` of a fresh env made from ``cfg``, as the error to raise (None: not the old API, or the env
    cannot be made)."""
    try:
        env = make_env(cfg)
    except Exception:
        return None
    try:
        old = old_api(env, seed)
    finally:
        with contextlib.suppress(Exception):
            env.close()
    return None if old is None else EnvLoadError(f"env {cfg.name!r}: {old}")
