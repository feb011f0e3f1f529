"""An env copy that raises is recreated alone, and its episode ends there; the rest of the vector env goes on.

RLlib's env runners do the same (restart the failed sub-environment and go on): a simulator that raises on one step
in 400 would otherwise cost the whole segment of every env copy, or the run. :class:`RecreateOnFailure` wraps each
copy of a gymnasium vector env (:func:`dppo.envs.make.env_factory`). When ``step`` raises, it returns an episode
end in place of the step: ``truncated`` with reward 0 and the last observation the env gave as the final one, so
the learner bootstraps that step from V(last observation) and never across into the next episode. Not
``terminated``: a crash is not a state of the task, and a value target of 0 there would teach the value function
that the states before a crash are worthless, a bias that grows with every failure. The vector env's SAME_STEP
autoreset then calls ``reset``, which makes a fresh copy from the factory and puts the failure in the reset's
info (``info["env_failure"]``: the exception and the user's file:line; ``info["env_failure_traceback"]``), which
the sampler counts and whose episode it leaves out of episode returns and lengths. A reset that keeps raising,
with a fresh copy each time, is an :class:`EnvFailure`: an env that never gets through a reset stops the run. (The
first, seeded reset is left alone: an env that cannot start is bad input, named as such where the actor starts.)

dppo's own vector envs recreate a copy alone the same way (PettingZoo's Parallel copies: :mod:`dppo.envs.columns`;
self-play games: :mod:`dppo.envs.selfplay`). A vector env that cannot isolate a copy (ale-py's) raises out of its
``step``: the sampler makes it afresh mid-segment and cuts each of its episodes as a failure (:func:`failure_info`,
:meth:`dppo.rl.sampler.Sampler._step`), so the segment is kept. A copy or a whole vector env, each is made afresh by
one function, :func:`fresh_copy`: its reset retried on another fresh one, each with its own seed.
"""

from __future__ import annotations

import contextlib
import sysconfig
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np

from dppo.envs.api import old_step_error
from dppo.errors import UsageError, first_line

RESEED_STEP = 1_000_003  # a recreated copy's seed: its first seed plus this per recreation (reproducible, apart)


class EnvFailure(RuntimeError):
    """An env kept raising after every retry: one line naming the env, the error and where it was raised (the actor
    pool adds which actor); ``details`` holds the whole traceback (it reaches train.log, not the terminal)."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


LIBRARIES = tuple({sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def own_frame(frames: list[tuple[str, int]]) -> str:
    """Of a traceback's (file, line) frames, outermost first, the one line a user needs, as file:line: the innermost
    frame of the user's own code (outside the standard library, installed packages and this wrapper), else the
    innermost one."""
    if not frames:
        return "unknown place"
    own = [f for f in frames if not f[0].startswith(LIBRARIES) and f[0] != __file__]
    filename, line = (own or frames)[-1]
    return f"{filename}:{line}"


def last_frame(err: BaseException) -> str:
    """Where an exception was raised, as file:line (:func:`own_frame`)."""
    return own_frame([(f.filename, f.lineno or 0) for f in traceback.extract_tb(err.__traceback__)])


def describe(err: BaseException) -> str:
    """An env's exception in one line, with where it was raised: ``ValueError: boom (at mysim.py:42)``."""
    return f"{type(err).__name__}: {first_line(err)} (at {last_frame(err)})"


class RecreateOnFailure(gym.Wrapper):
    """One env copy that survives its own exceptions (see the module docstring). ``make``: the factory of the copy;
    ``reset_tries``: resets (each on a fresh copy) before an env that cannot reset is an EnvFailure."""

    def __init__(self, make: Callable[[], gym.Env], name: str, reset_tries: int) -> None:
        super().__init__(make())
        self.make, self.name, self.reset_tries = make, name, reset_tries
        self.first_seed: int | None = None
        self.recreated = 0
        self.last_obs: Any = None
        self.failure: tuple[str, str] | None = None  # (line, traceback) of a step that raised, until the next reset

    def step(self, action: Any) -> Any:
        try:
            result = self.env.step(action)
        except Exception as err:
            if old_step_error(err, self.name) is not None:  # the env's API, not a passing fault
                raise
            self.failure = (describe(err), traceback.format_exc())
            with contextlib.suppress(Exception):
                self.env.close()
            return self.last_obs, 0.0, False, True, {}
        self.last_obs = result[0]  # passed on as it came: a malformed result is named by the caller's checks
        return result

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        if seed is not None:  # the vector env's start (or restart): what fails there is named by the start's checks
            self.first_seed, self.recreated, self.failure = seed, 0, None
            result = self.env.reset(seed=seed, options=options)
            self.last_obs = result[0]
            return result
        failed = [] if self.failure is None else [self.failure]  # the step's failure, then each try's that raised
        self.failure = None
        seeds: list[int | None] = []  # each try's seed: none on the copy itself, its own on each fresh one

        def make() -> gym.Env:
            if not seeds and not failed:  # an episode's end: its reset is tried on the copy itself first
                seeds.append(None)
                return self.env
            self.recreated += 1
            seeds.append(None if self.first_seed is None else self.first_seed + RESEED_STEP * self.recreated)
            return self.make()

        self.env, (obs, info) = fresh_copy(make, lambda env: env.reset(seed=seeds[-1], options=options), self.name,
                                           self.reset_tries, failed=failed)
        self.last_obs = obs
        if failed:  # the last try that raised, else the step's
            info = {**info, "env_failure": failed[-1][0], "env_failure_traceback": failed[-1][1]}
        return obs, info


Made = TypeVar("Made")
Started = TypeVar("Started")


def fresh_copy(make: Callable[[], Made], start: Callable[[Made], Started], name: str, tries: int,
               broken: Any = None, cause: str | None = None,
               failed: list[tuple[str, str]] | None = None) -> tuple[Made, Started]:
    """The one recovery path of every env kind: a fresh copy from ``make`` (``broken``, the one it replaces, closed
    first) and what ``start`` of it returned (its reset, each try seeded apart by the caller). A start that raises is
    tried on another fresh copy, ``tries`` times, then one EnvFailure with the user's file:line (``cause``: the step's
    exception that broke a whole vector env); each failed try's (line, traceback) goes to ``failed``."""
    attempts = 0
    while True:
        with contextlib.suppress(Exception):
            if broken is not None:
                broken.close()
        attempts += 1
        try:
            broken = make()
            return broken, start(broken)
        except (EnvFailure, UsageError):  # what no retry mends
            raise
        except Exception as err:
            if failed is not None:
                failed.append((describe(err), traceback.format_exc()))
            if attempts > tries:
                what = (f"raised in step ({cause}), and its vector env made afresh could not reset in {attempts} tries"
                        if cause else f"never got through a reset (tried {attempts} times, recreating it each time)")
                raise EnvFailure(f"env {name} {what}: {describe(err)}", traceback.format_exc()) from err


def failure_info(failed: np.ndarray, line: str, details: str) -> dict[str, Any]:
    """A vector env's info saying that the copies (columns) in ``failed`` were cut by one failure (``line``, its
    traceback ``details``): what :func:`failed_envs` reads, as a recreated gymnasium copy reports it."""
    return {"env_failure": np.array([line] * len(failed), object), "_env_failure": np.asarray(failed, bool),
            "env_failure_traceback": np.array([details] * len(failed), object)}


def failed_envs(infos: list[dict[str, Any]], widths: list[int]) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Of one step's vector-env infos (one per half, ``widths`` envs each): which env copies were recreated after a
    failure (E,) bool, and each one's (line, traceback)."""
    masks, failures = [], []
    for info, width in zip(infos, widths, strict=True):
        mask = np.asarray(info.get("_env_failure", np.zeros(width, bool)), bool)
        masks.append(mask)
        failures += [(info["env_failure"][i], info["env_failure_traceback"][i]) for i in np.flatnonzero(mask)]
    return np.concatenate(masks), failures
