"""Loading a PettingZoo env as the ``env`` config names it: its module's ``parallel_env`` (or, for a turn-based game,
its ``env``) or an entry point, then its wrappers (functions of the PettingZoo env, as SuperSuit's are). Every way
it can fail to load is an :class:`~dppo.envs.user_code.EnvLoadError` naming what failed and how to fix it;
:mod:`dppo.envs.make` turns what it returns into the env and vector env of its kind."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from dppo.envs.user_code import SHIP_HINT, EnvLoadError, call_factory, import_module, load_callable

if TYPE_CHECKING:
    from dppo.config import EnvConfig


# What to install when a PettingZoo env's module cannot be imported, by its top-level package
PETTINGZOO_PACKAGES = {"mpe2": "pip install mpe2", "pettingzoo": "pip install 'dppo[multiagent]'"}


def _pettingzoo_install_hint(module_name: str) -> str:
    parts = module_name.split(".")
    if parts[0] == "pettingzoo" and len(parts) > 2 and importlib.util.find_spec("pettingzoo") is not None:
        return f"pip install 'pettingzoo[{parts[1]}]'"  # the family's own dependencies (butterfly: pygame, pymunk)
    if parts[0] in PETTINGZOO_PACKAGES:
        return PETTINGZOO_PACKAGES[parts[0]]
    return f"install the package that provides it; {SHIP_HINT}"


def _pettingzoo_factory(cfg: EnvConfig) -> Callable[..., Any]:
    """The function that makes the env: the entry point, else the module's parallel_env, else (a turn-based game)
    its env()."""
    if cfg.entry_point:
        return load_callable(cfg.entry_point, "env entry point")
    module_name = cfg.id or ""
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EnvLoadError(f"cannot import the PettingZoo env module {module_name!r} ({err}); "
                           f"{_pettingzoo_install_hint(module_name)}") from None
    except Exception as err:  # the module raised while importing
        raise EnvLoadError(f"importing module {module_name!r} raised {type(err).__name__}: {err}") from None
    factory = getattr(module, "parallel_env", None) or getattr(module, "env", None)
    if not callable(factory):
        raise EnvLoadError(f"module {module_name!r} has neither parallel_env() nor env(); a PettingZoo env module "
                           "makes its Parallel env with parallel_env(**kwargs) or its turn-based (AEC) game with "
                           "env(**kwargs): name such a module, or a function with env.entry_point: "
                           "module.path:function")
    return factory


def _require_pettingzoo_env(env: Any, what: str) -> Any:
    try:
        from pettingzoo import AECEnv, ParallelEnv
    except ImportError:
        raise EnvLoadError(f"{what} needs PettingZoo (env.multiagent): pip install 'dppo[multiagent]'") from None
    if not isinstance(env, (ParallelEnv, AECEnv)):
        raise EnvLoadError(f"{what} returned a {type(env).__name__}, not a PettingZoo ParallelEnv or AECEnv; return "
                           "one, or set env.multiagent to false for a gymnasium env")
    return env


def make_pettingzoo_env(cfg: EnvConfig, render_mode: str | None = None) -> Any:
    """One PettingZoo env (Parallel, or AEC for a turn-based game) as the config names it, with its wrappers
    (functions of the PettingZoo env, as SuperSuit's are)."""
    factory = _pettingzoo_factory(cfg)
    try:
        env = call_factory(factory, f"env {cfg.name!r}", cfg.kwargs, render_mode)
    except EnvLoadError:
        raise
    except Exception as err:  # the user's constructor raised: their input, not our bug
        raise EnvLoadError(f"making env {cfg.name!r} raised {type(err).__name__}: {err}; "
                           "check the env's code and env.kwargs") from None
    what = f"env {cfg.name!r}"
    for wrapper in cfg.wrappers:
        if ":" not in wrapper.name:
            raise EnvLoadError(f"wrapper {wrapper.name!r}: a PettingZoo env's wrappers are functions of the "
                               "PettingZoo env, written module.path:function (e.g. supersuit:color_reduction_v0)")
        try:
            env = load_callable(wrapper.name, "wrapper")(env, **wrapper.kwargs)
        except TypeError as err:
            raise EnvLoadError(f"wrapper {wrapper.name!r} rejected kwargs {wrapper.kwargs} ({err}); fix its kwargs"
                               ) from None
        what = f"wrapper {wrapper.name!r}"
    return _require_pettingzoo_env(env, what)


def names_pettingzoo_module(cfg: EnvConfig) -> bool:
    """env.id names an importable module (no gymnasium id) that has parallel_env() or, for a turn-based game, env():
    a PettingZoo env of one's own, named as ``--env mymodule`` without env.multiagent."""
    env_id = cfg.id
    if cfg.multiagent or cfg.entry_point or not env_id or ":" in env_id or env_id in gym.registry:
        return False
    try:
        if importlib.util.find_spec(env_id) is None:
            return False
    except (ImportError, ValueError):  # not a module name, or its parent package is missing
        return False
    module = import_module(env_id, f"env {env_id!r}")
    return any(callable(getattr(module, name, None)) for name in ("parallel_env", "env"))
