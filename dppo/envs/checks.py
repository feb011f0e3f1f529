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
import traceback
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from dppo.envs.make import make_env, make_parallel_envs
from dppo.envs.multiagent import AgentTurns
from dppo.envs.user_code import EnvLoadError
from dppo.errors import first_line

if TYPE_CHECKING:
    from dppo.config import Config, EnvConfig

API = ("gymnasium's API: reset() -> (obs, info), step() -> (obs, reward, terminated, truncated, info), every "
       "observation in the declared observation_space")

PARALLEL_API = ("PettingZoo's Parallel API: reset() -> (obs, infos), step(actions) -> (obs, rewards, terminations, "
                "truncations, infos), each a dict keyed by agent, every observation in its agent's observation_space")

# gymnasium 1.x no longer converts old-API envs itself (make's apply_api_compatibility is gone); shimmy does.
_SHIMMY = ("or, for an env of the old gym package, convert it with shimmy: pip install 'shimmy[gym-v21]' and "
           "--set env.entry_point=shimmy:GymV21CompatibilityV0 --set env.kwargs.env_id=<its gym id>")
OLD_STEP = ("step() returned 4 values (obs, reward, done, info): the old gym API; gymnasium's step() returns 5, (obs, "
            "reward, terminated, truncated, info): split done into terminated (the episode ended) and truncated (a "
            f"time limit cut it), {_SHIMMY}")
OLD_RESET = ("reset() returned only an observation: the old gym API; gymnasium's reset(*, seed=None, options=None) "
             f"returns (obs, info): return the observation and an info dict, {_SHIMMY}")
OLD_RESET_SEED = ("reset() takes no seed: the old gym API; gymnasium's reset(*, seed=None, options=None) returns "
                  f"(obs, info) and seeds the env (call super().reset(seed=seed) in it), {_SHIMMY}")


def check_env(config: Config) -> dict[str, tuple[gym.Space, gym.Space, Any]]:
    """Make one env, reset it, take one step: each policy's spaces and first observation (one policy without a
    policy map), or EnvLoadError naming the env, the call and the fix."""
    if config.policies:
        return check_mapped_env(config)
    return {config.policy_names[0]: check_one_env(config)}


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
        return space, env.action_space, first
    finally:
        with contextlib.suppress(Exception):
            env.close()


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


def parallel_problem(result: Any, size: int, spaces: dict[str, gym.Space]) -> str | None:
    """What is wrong with a Parallel env's reset (2 items: obs and infos by agent) or step (5, each by agent)."""
    if not isinstance(result, tuple) or len(result) != size:
        got = f"a {len(result)}-tuple" if isinstance(result, tuple) else f"a {type(result).__name__}"
        return f"{got}, not {'(obs, infos)' if size == 2 else '(obs, rewards, terminations, truncations, infos)'}"
    if not all(isinstance(part, dict) for part in result):
        return "something other than dicts keyed by agent"
    return next((problem for agent, obs in result[0].items() if agent in spaces
                 and (problem := obs_problem(obs, spaces[agent], f"obs[{agent!r}]")) is not None), None)


def check_multiagent(config: Config) -> None:
    """What a multi-agent env needs of the rest of the config: a memoryless policy."""
    if config.model.recurrent != "none":
        raise EnvLoadError(f"model.recurrent {config.model.recurrent!r} with the multi-agent env {config.env.name!r} "
                           "is not supported yet: evaluation plays the agents in turns through one memory; "
                           "set model.recurrent: none (env.agent_id_in_obs tells agents apart)")


def old_api(env: gym.Env, seed: int | None = None) -> str | None:
    """How the env's own reset() or step() follows the old gym API, with the fix; None when neither does (or either
    raises). Asks the env under its wrappers, whose unpacking of gymnasium's shapes is what raised. It resets and
    steps the env: for error paths only."""
    core = env.unwrapped
    try:
        try:
            result = core.reset(seed=seed)
        except TypeError as err:
            return OLD_RESET_SEED if "unexpected keyword argument 'seed'" in str(err) else None
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
            return OLD_RESET if obs_problem(result, core.observation_space, "obs") is None else None
        result = core.step(core.action_space.sample())
    except Exception:
        return None
    return OLD_STEP if isinstance(result, tuple) and len(result) == 4 else None


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


def old_step_error(err: BaseException, name: str) -> EnvLoadError | None:
    """An error raised where gymnasium unpacks a step() into 5 values and got 4, named as the old gym API; else None.
    Read from the error alone, without stepping the env again: for the step loops, whose env keeps running."""
    frames = traceback.extract_tb(err.__traceback__)
    inside_gymnasium = bool(frames) and "gymnasium" in frames[-1].filename
    if isinstance(err, ValueError) and "(expected 5, got 4)" in str(err) and inside_gymnasium:
        return EnvLoadError(f"env {name!r}: {OLD_STEP}")
    return None


def result_problem(result: Any, size: int, space: gym.Space) -> str | None:
    """What is wrong with a reset (2 items) or step (5 items) result, or None."""
    if not isinstance(result, tuple) or len(result) != size:
        got = f"a {len(result)}-tuple" if isinstance(result, tuple) else f"a {type(result).__name__}"
        return f"{got}, not {'(obs, info)' if size == 2 else '(obs, reward, terminated, truncated, info)'}"
    if not isinstance(result[-1], dict):
        return f"info of type {type(result[-1]).__name__}, not a dict"
    return obs_problem(result[0], space, "obs")


def obs_problem(obs: Any, space: gym.Space, path: str) -> str | None:
    """The first leaf of ``obs`` that does not fit ``space`` (structure, shape, kind of number), named by its path."""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obs, dict):
            return f"{path} of type {type(obs).__name__} where the space is a Dict with keys {list(space.spaces)}"
        if set(obs) != set(space.spaces):
            return f"{path} with keys {sorted(obs)} where the space has {sorted(space.spaces)}"
        return next((p for key, sub in space.spaces.items()
                     if (p := obs_problem(obs[key], sub, f"{path}[{key!r}]")) is not None), None)
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(obs, tuple) or len(obs) != len(space.spaces):
            return f"{path} that is not a tuple of {len(space.spaces)}"
        return next((p for i, sub in enumerate(space.spaces)
                     if (p := obs_problem(obs[i], sub, f"{path}[{i}]")) is not None), None)
    if not isinstance(space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                              gym.spaces.MultiBinary)):
        return None  # other spaces are refused with their own message when the model is built
    value = np.asarray(obs)
    shape = () if isinstance(space, gym.spaces.Discrete) else tuple(space.shape)
    if value.shape != shape:
        return f"{path} of shape {value.shape} where {space} has shape {shape}"
    if not isinstance(space, gym.spaces.Box) and not np.issubdtype(value.dtype, np.integer):
        return f"{path} of dtype {value.dtype} where {space} holds integers"
    if not np.issubdtype(value.dtype, np.number) and value.dtype != np.bool_:
        return f"{path} of dtype {value.dtype}, not numbers"
    return None
