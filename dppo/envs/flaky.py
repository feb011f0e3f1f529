"""Envs that raise now and then, of every kind dppo trains, for fault tests, the chaos benchmark and the docs:
a gymnasium env (:func:`flaky_gym`), a PettingZoo Parallel env of two agents (:class:`FlakyPair`) and a
turn-based game (:func:`flaky_tictactoe`). Named by entry point (``--set env.entry_point=dppo.envs.flaky:flaky_gym``,
with ``env.multiagent=true`` for the PettingZoo ones).

Each ``step`` raises ValueError with probability 1/``every``, drawn from a stream seeded by the env's seeded reset (a
recreated copy is seeded apart by dppo), so a seeded run repeats. By default only inside a Ray actor: the driver's
check at start and ``dppo eval`` play an env that never raises (``anywhere=True``: in every process).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv
from pettingzoo.utils import BaseWrapper

FAULT = "the simulator lost its state (dppo.envs.flaky)"


def in_an_actor() -> bool:
    """This process is a Ray actor's (a training actor), not the driver or ``dppo eval``."""
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


class Faults:
    """The draws of one env copy: whether its next step raises."""

    def __init__(self, every: int, anywhere: bool) -> None:
        self.every, self.anywhere = every, anywhere
        self.draws = np.random.default_rng(0)

    def seed(self, seed: int | None) -> None:
        if seed is not None:
            self.draws = np.random.default_rng(seed + 400_009)

    def step(self) -> None:
        if self.draws.random() < 1 / self.every and (self.anywhere or in_an_actor()):
            raise ValueError(FAULT)


class FlakyEnv(gym.Wrapper):
    """A gymnasium env whose ``step`` raises on about one step in ``every``."""

    def __init__(self, env: gym.Env, every: int = 300, anywhere: bool = False) -> None:
        super().__init__(env)
        self.faults = Faults(every, anywhere)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.faults.seed(seed)
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        self.faults.step()
        return self.env.step(action)


def flaky_gym(env_id: str = "CartPole-v1", every: int = 300, anywhere: bool = False, **kwargs: Any) -> gym.Env:
    """``env_id`` made by gymnasium (its time limit included), raising on about one step in ``every``."""
    return FlakyEnv(gym.make(env_id, **kwargs), every, anywhere)


class FlakyPair(ParallelEnv):
    """Two agents with one task: the speaker sees a target (one of 3) and says a word, the listener hears the word and
    names the target; both get 1 when it is right. 10 steps an episode (optimal return 10 each); the roles are
    told apart by the last observation component, so one shared policy can learn both (or a policy map, one each).
    ``step`` raises on about one step in ``every``."""

    metadata: ClassVar[dict[str, Any]] = {"name": "flaky_pair_v0"}
    possible_agents: ClassVar[list[str]] = ["speaker", "listener"]

    def __init__(self, every: int = 300, anywhere: bool = False, steps: int = 10, render_mode: str | None = None
                 ) -> None:
        self.faults, self.steps, self.render_mode = Faults(every, anywhere), steps, render_mode
        self.agents: list[str] = []
        self.rng = np.random.default_rng(0)
        self.target = self.word = self.t = 0

    @functools.cache  # noqa: B019 - the same space object per agent, as PettingZoo asks
    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(0.0, 1.0, (4,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(3)

    def _observations(self) -> dict[str, np.ndarray]:
        speaker, listener = np.zeros(4, np.float32), np.eye(4, dtype=np.float32)[3]
        speaker[self.target] = 1.0
        listener[self.word] = 1.0
        return {"speaker": speaker, "listener": listener}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.faults.seed(seed)
        self.agents, self.t = list(self.possible_agents), 0
        self.target, self.word = int(self.rng.integers(3)), 0
        return self._observations(), {agent: {} for agent in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.faults.step()
        reward = float(int(actions.get("listener", -1)) == self.target)
        self.word = int(actions.get("speaker", 0))
        self.t += 1
        self.target = int(self.rng.integers(3))
        done = self.t >= self.steps
        agents = self.agents
        self.agents = [] if done else list(agents)
        return (self._observations(), dict.fromkeys(agents, reward), dict.fromkeys(agents, False),
                dict.fromkeys(agents, done), {agent: {} for agent in agents})


def flaky_pair(every: int = 300, anywhere: bool = False, **kwargs: Any) -> FlakyPair:
    """The env factory (``env.entry_point: dppo.envs.flaky:flaky_pair``)."""
    return FlakyPair(every, anywhere, **kwargs)


class FlakyTurns(BaseWrapper):
    """A turn-based (AEC) game whose ``step`` raises on about one move in ``every``."""

    def __init__(self, env: Any, every: int, anywhere: bool) -> None:
        super().__init__(env)
        self.faults = Faults(every, anywhere)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.faults.seed(seed)
        super().reset(seed=seed, options=options)

    def step(self, action: Any) -> None:
        self.faults.step()
        super().step(action)


def flaky_tictactoe(every: int = 300, anywhere: bool = False, **kwargs: Any) -> FlakyTurns:
    """PettingZoo's tic-tac-toe, raising on about one move in ``every`` (``env.entry_point:
    dppo.envs.flaky:flaky_tictactoe``, trained by self-play)."""
    from pettingzoo.classic import tictactoe_v3

    return FlakyTurns(tictactoe_v3.env(**kwargs), every, anywhere)
