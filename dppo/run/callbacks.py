"""A user's callbacks: functions called in the driver after each iteration with its figures (SB3's callbacks,
RLlib's ``on_train_result``), from ``run.callbacks: [module.path:function]`` (the CLI, the chart) and
``dppo.train(callbacks=[...])``.

A callback gets one :class:`IterationInfo`. ``raise dppo.StopRun("reason")`` ends the run after this iteration
(final checkpoint, exit 0, the reason in summary.json); returning ``False`` (as an SB3 callback's ``_on_step``) does
the same with the reason ``callback``; anything else it returns is ignored. Any other exception fails the run (exit
1) after a checkpoint, with one line that names the callback and its error (the traceback in train.log).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppo.errors import RunFailure, StopRun, UsageError, first_line

if TYPE_CHECKING:
    from dppo.config import Config

FIX = "name a function that takes one argument, e.g. mypackage.callbacks:stop_when_solved"


@dataclass(frozen=True)
class IterationInfo:
    """What a callback is given after each iteration."""

    progress: dict[str, Any]  # the iteration's progress.jsonl record (iteration, env_steps, episode_return_mean...)
    run_dir: Path
    checkpoint: Path | None  # the checkpoint written after this iteration (run.checkpoint_every), else None
    config: Config

    @property
    def iteration(self) -> int:
        return int(self.progress["iteration"])

    @property
    def env_steps(self) -> int:
        return int(self.progress["env_steps"])

    @property
    def episode_return_mean(self) -> float | None:
        """The mean return of the last 100 training episodes (None before the first ended)."""
        return self.progress.get("episode_return_mean")


Callback = Callable[[IterationInfo], Any]


def load_callback(ref: str) -> Callback:
    """``module.path:function`` -> the function, imported the way env modules are (the run's working directory and
    PYTHONPATH on the path); every way it can fail is one UsageError line."""
    from dppo.envs.user_code import import_module

    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"run.callbacks: {ref!r} is not module.path:function; {FIX}")
    found: Any = import_module(module_name, f"run.callbacks entry {ref!r}")
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise UsageError(f"run.callbacks: module {module_name!r} has no {attr!r} ({ref!r}); check the "
                             "name") from None
    if not callable(found):
        raise UsageError(f"run.callbacks: {ref!r} is a {type(found).__name__}, not a function; {FIX}")
    return found


def name_of(function: Callable[..., Any]) -> str:
    """A function as a line names it: ``module:qualname``."""
    module = getattr(function, "__module__", None) or "?"
    return f"{module}:{getattr(function, '__qualname__', type(function).__name__)}"


def resolve_callbacks(config: Config, given: list[Callback] | None = None) -> list[tuple[str, Callback]]:
    """The run's callbacks by name: run.callbacks' in order, then the functions ``given`` in Python; bad input (a
    module or name that is not there, something not callable) raises UsageError before anything is written."""
    named = [(ref, load_callback(ref)) for ref in config.run.callbacks]
    for function in given or []:
        if not callable(function):
            raise UsageError(f"callbacks: {function!r} is a {type(function).__name__}, not a function; pass functions "
                             "that take one argument (dppo.IterationInfo)")
        named.append((name_of(function), function))
    return named


class Callbacks:
    """The run's callbacks, called in order after each iteration; :meth:`after` returns the stop reason asked for."""

    def __init__(self, named: list[tuple[str, Callback]], config: Config) -> None:
        self.named, self.config = named, config

    def after(self, progress: dict[str, Any], run_dir: Path, checkpoint: Path | None) -> str | None:
        """Call every callback (each sees the iteration, as SB3's CallbackList); the first stop reason asked for,
        or None. A callback that raises anything but StopRun fails the run (RunFailure, traceback as details)."""
        if not self.named:
            return None
        info = IterationInfo(dict(progress), run_dir, checkpoint, self.config)
        reason = None
        for name, function in self.named:
            try:
                answer = function(info)
            except StopRun as stop:
                reason = reason or stop.reason
            except Exception as err:
                raise RunFailure(f"callback {name} raised {type(err).__name__}: {first_line(err)}",
                                 traceback.format_exc()) from err
            else:
                if answer is False:
                    reason = reason or "callback"
        return reason
