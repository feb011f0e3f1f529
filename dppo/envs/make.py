"""Making envs from the ``env`` config section, the same way in the learner and in every actor.

Three ways to name an env, as gymnasium users already write them:
- a registered id (``CartPole-v1``);
- ``module.path:EnvId-v0``: import ``module.path`` (which registers the env), then make ``EnvId-v0``;
- ``env.entry_point: module.path:callable`` (an Env subclass or a factory) with ``env.kwargs``.
Then the configured wrappers, in order. Every way a user's code can fail to load becomes an
:class:`EnvLoadError` (exit 2, one line) that names what failed and how to fix it.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

import dppo.envs.toy  # noqa: F401 - registers the dppo/ test envs in every process that makes envs
from dppo.envs.atari import make_ale_vector_env, make_atari_env, require_ale
from dppo.errors import UsageError

if TYPE_CHECKING:
    from dppo.config import Config, EnvConfig

SHIP_HINT = ("it must be importable in the learner and in every Ray worker: locally, run from its directory or "
             "put it on PYTHONPATH; on a cluster, install it in the image or ship it with run.runtime_env "
             "(working_dir, py_modules or pip; chart value runtimeEnv)")


class EnvLoadError(UsageError):
    """The env (or a wrapper) named in the config cannot be imported, called or made."""


class LatencyWrapper(gym.Wrapper):
    """Makes each step take latency_ms in all, sleeping out what the wrapped env's own step leaves, so the
    CPU is released as a remote simulator or a robot would release it. The step as a whole is timed, not
    the sleep alone: a sleep's overshoot and the env's own work would otherwise add to every step."""

    def __init__(self, env: gym.Env, latency_ms: float) -> None:
        super().__init__(env)
        self.delay = latency_ms / 1000.0
        self.debt = 0.0  # how much the last step overran: taken off the next, so the mean latency is exact

    def step(self, action):
        start = time.perf_counter()
        result = self.env.step(action)
        target = self.delay - self.debt
        wait = target - (time.perf_counter() - start)
        if wait > 0:
            time.sleep(wait)
        # bounded: one long stall must not turn the following steps into a burst without latency
        self.debt = min(time.perf_counter() - start - target, self.delay)
        return result


def driver_import_paths() -> list[str]:
    """Where the driver finds user modules: its working directory and PYTHONPATH (handed to local actors)."""
    paths = [os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return [p for p in dict.fromkeys(paths) if p]


def add_import_paths(paths: list[str]) -> None:
    """Put the driver's paths on sys.path (those that exist here: on a cluster node they usually do not)."""
    for path in reversed(paths):
        if path not in sys.path and os.path.isdir(path):
            sys.path.insert(0, path)


def import_module(name: str, purpose: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise EnvLoadError(f"cannot import module {name!r} for {purpose} ({err}); {SHIP_HINT}") from None
    except Exception as err:  # the user's module raised while importing
        raise EnvLoadError(f"importing module {name!r} for {purpose} raised {type(err).__name__}: {err}") from None


def load_callable(ref: str, purpose: str) -> Callable[..., Any]:
    """``module.path:name`` -> the object, which must be callable."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise EnvLoadError(f"{purpose} {ref!r} is not module.path:name; write e.g. mypackage.envs:MyEnv")
    obj: Any = import_module(module_name, purpose)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EnvLoadError(f"module {module_name!r} has no {attr!r} ({purpose} {ref!r}); check the name") from None
    if not callable(obj):
        raise EnvLoadError(f"{purpose} {ref!r} is a {type(obj).__name__}, not a class or function; "
                           "name an Env subclass or a function that returns an Env")
    return obj


def _wrapper_class(name: str) -> Callable[..., Any]:
    """``module:Class``, or the bare name of one of gymnasium's own wrappers (``FlattenObservation``)."""
    if ":" not in name:
        if hasattr(gym.wrappers, name):
            return getattr(gym.wrappers, name)
        raise EnvLoadError(f"wrapper {name!r} is not one of gymnasium.wrappers; write module.path:Class")
    return load_callable(name, "wrapper")


def _make_registered(cfg: EnvConfig, render_mode: str | None) -> gym.Env:
    env_id = cfg.id or ""
    if env_id.startswith("ALE/"):
        require_ale()
    module_name, sep, name = env_id.rpartition(":")
    if sep:
        import_module(module_name, f"env {env_id!r}")
        env_id = name
    kwargs = dict(cfg.kwargs)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as err:
        raise EnvLoadError(f"env {cfg.id!r} needs a package that is not installed ({err}); install its extra, "
                           "e.g. pip install 'dppo[box2d]' or 'dppo[mujoco]'") from None
    except gym.error.Error as err:
        hint = (f"did importing {module_name!r} register it?" if sep else
                "use a registered id such as CartPole-v1, module.path:EnvId-v0, or env.entry_point")
        raise EnvLoadError(f"unknown environment {cfg.id!r} ({err}); {hint}") from None
    except TypeError as err:
        raise EnvLoadError(f"env {cfg.id!r} rejected env.kwargs {cfg.kwargs} ({err}); fix env.kwargs") from None


def _make_entry_point(cfg: EnvConfig, render_mode: str | None) -> gym.Env:
    factory = load_callable(cfg.entry_point or "", "env entry point")
    kwargs = dict(cfg.kwargs)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        env = factory(**kwargs)
    except TypeError as err:
        raise EnvLoadError(f"env entry point {cfg.entry_point!r} rejected env.kwargs {cfg.kwargs} ({err}); "
                           "fix env.kwargs") from None
    if not isinstance(env, gym.Env):
        raise EnvLoadError(f"env entry point {cfg.entry_point!r} returned a {type(env).__name__}, not a "
                           "gymnasium.Env; return an Env instance")
    env = gym.wrappers.PassiveEnvChecker(env)  # what gymnasium.make adds to registered envs
    if cfg.max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, cfg.max_episode_steps)
    return env


def make_env(cfg: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """One env as the config names it, with its wrappers (no latency wrapper: that is for benchmarks)."""
    try:
        if cfg.atari:
            env = make_atari_env(cfg, render_mode)
        elif cfg.entry_point:
            env = _make_entry_point(cfg, render_mode)
        else:
            env = _make_registered(cfg, render_mode)
    except UsageError:
        raise
    except Exception as err:  # the user's constructor raised: their input, not our bug
        raise EnvLoadError(f"making env {cfg.name!r} raised {type(err).__name__}: {err}; "
                           "check the env's code and env.kwargs") from None
    for wrapper in cfg.wrappers:
        cls = _wrapper_class(wrapper.name)
        try:
            env = cls(env, **wrapper.kwargs)
        except TypeError as err:
            raise EnvLoadError(f"wrapper {wrapper.name!r} rejected kwargs {wrapper.kwargs} ({err}); fix its kwargs"
                               ) from None
        if not isinstance(env, gym.Env):
            raise EnvLoadError(f"wrapper {wrapper.name!r} returned a {type(env).__name__}, not a gymnasium.Env")
    return env


def env_factory(config: Config) -> Callable[[], gym.Env]:
    """The function the vector env calls for each of its E envs (and again when the sampler restarts it)."""
    env_cfg, latency = config.env, config.env.latency_ms

    def make() -> gym.Env:
        env = make_env(env_cfg)
        return LatencyWrapper(env, latency) if latency > 0 else env

    return make


def make_vector_env(config: Config) -> VectorEnv:
    """E copies of the env in one vector env, autoreset mode set explicitly to SAME_STEP."""
    if config.env.vectorization == "ale":
        return make_ale_vector_env(config)
    fns = [env_factory(config)] * config.env.num_envs
    if config.env.vectorization == "async":
        return AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)


def env_spaces(config: Config) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of one env, checked: the learner builds its model from these."""
    from dppo.rl.spaces import check_spaces

    env = make_env(config.env)
    try:
        spaces = env.observation_space, env.action_space
    finally:
        env.close()
    check_spaces(*spaces)
    return spaces
