"""What gymnasium's and PettingZoo's APIs require of what an env returns, and how an env of the old gym API is told
apart: the checks of :mod:`dppo.envs.checks` (at start), the sampler and ``dppo eval`` (in their step loops) and the
env wrappers read them. No env is made here.
"""

from __future__ import annotations

import traceback
from typing import Any

import gymnasium as gym
import numpy as np

from dppo.envs.user_code import EnvLoadError

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


def old_step_error(err: BaseException, name: str) -> EnvLoadError | None:
    """An error raised where gymnasium unpacks a step() into 5 values and got 4, named as the old gym API; else None.
    Read from the error alone, without stepping the env again: for the step loops, whose env keeps running."""
    frames = traceback.extract_tb(err.__traceback__)
    inside_gymnasium = bool(frames) and "gymnasium" in frames[-1].filename
    if isinstance(err, ValueError) and "(expected 5, got 4)" in str(err) and inside_gymnasium:
        return EnvLoadError(f"env {name!r}: {OLD_STEP}")
    return None


def parallel_problem(result: Any, size: int, spaces: dict[str, gym.Space]) -> str | None:
    """What is wrong with a Parallel env's reset (2 items: obs and infos by agent) or step (5, each by agent)."""
    if not isinstance(result, tuple) or len(result) != size:
        got = f"a {len(result)}-tuple" if isinstance(result, tuple) else f"a {type(result).__name__}"
        return f"{got}, not {'(obs, infos)' if size == 2 else '(obs, rewards, terminations, truncations, infos)'}"
    if not all(isinstance(part, dict) for part in result):
        return "something other than dicts keyed by agent"
    return next((problem for agent, obs in result[0].items() if agent in spaces
                 and (problem := obs_problem(obs, spaces[agent], f"obs[{agent!r}]")) is not None), None)


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
