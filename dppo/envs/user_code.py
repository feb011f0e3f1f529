"""Loading a user's code by name, the same way in the driver and in every actor: ``module.path:name``
references, and the driver's import paths handed to local actors. Every way it can fail is an
:class:`EnvLoadError` (exit 2, one line) that names what failed and how to fix it."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from dppo.errors import UsageError

SHIP_HINT = ("it must be importable in the driver and in every Ray worker: locally, run from its directory or "
             "put it on PYTHONPATH; on a cluster, install it in the image or ship it with run.runtime_env "
             "(working_dir, py_modules or pip; chart value runtimeEnv)")


class EnvLoadError(UsageError):
    """The env (or a wrapper) named in the config cannot be imported, called or made."""


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


def kwargs_error(what: str, kwargs: dict[str, Any], render_mode: str | None, err: TypeError) -> EnvLoadError:
    """An env constructor refused its arguments: blame render_mode when it was the one (``dppo eval --video``
    asks for frames), else env.kwargs."""
    if render_mode is not None and "render_mode" in str(err):
        return EnvLoadError(f"{what} has no render_mode (its constructor does not take one: {err}), so --video "
                            "cannot record it; give the env a render_mode argument that supports 'rgb_array', or "
                            "evaluate without --video")
    return EnvLoadError(f"{what} rejected env.kwargs {kwargs} ({err}); fix env.kwargs")


def call_factory(factory: Any, what: str, kwargs: dict[str, Any], render_mode: str | None) -> Any:
    """``factory(**kwargs)`` with the render mode; kwargs it does not take are one line naming ``what``."""
    try:
        return factory(**(kwargs if render_mode is None else {**kwargs, "render_mode": render_mode}))
    except TypeError as err:
        raise kwargs_error(what, kwargs, render_mode, err) from None
