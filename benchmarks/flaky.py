"""A simulator that raises now and then, for the learning check of issue 45 (item 1): an env copy that raises is
recreated alone and its episode cut (dppo.envs.failures), so a run on an env that raises on one step in 400 should
train to the return of the same run on the env that never raises.

Named as a wrapper from a clone's root (the actors import it from the working directory, as a user's module):
``python -m benchmarks variants --env CartPole-v1 --variant plain
--variant flaky:env.wrappers=[benchmarks.flaky:RaiseNowAndThen] ...``. It raises only in the training actors (Ray
actor processes): ``dppo eval`` then plays the env that never raises, so both variants are scored alike (training
returns leave out the cut episodes, and the long ones are cut most often).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def in_an_actor() -> bool:
    """This process is a Ray actor's (a training actor), not the driver or ``dppo eval``."""
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


class RaiseNowAndThen(gym.Wrapper):
    """``step`` raises ValueError on about one step in ``every`` (in a training actor), drawn from a stream seeded by
    the env's first seeded reset (a recreated copy is seeded apart by dppo), so a seeded run repeats."""

    def __init__(self, env: gym.Env, every: int = 400) -> None:
        super().__init__(env)
        self.every = every
        self.draws = np.random.default_rng(0)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:
            self.draws = np.random.default_rng(seed + 400_009)
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        if self.draws.random() < 1 / self.every and in_an_actor():
            raise ValueError("the simulator lost its state (benchmarks.flaky)")
        return self.env.step(action)
