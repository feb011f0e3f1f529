"""Small envs for tests, fault drills and benchmarks, registered as ``dppo/...`` ids by :mod:`dppo.envs`
(by name: this module is imported only when one of them is made).

- ``dppo/Counter-v0``: observation = steps since reset, reward 1; ends by termination at
  ``terminate_at`` (if set) or by truncation at ``max_episode_steps``. Makes episode boundaries,
  autoreset and bootstrapping checkable by eye.
- ``dppo/Faulty-v0``: CartPole-v1 that misbehaves on purpose at a given step count of its process:
  raises (``fail_at``), returns NaN (``nan_at``), or hangs (``hang_at`` for ``hang_s`` seconds).
- ``dppo/MatchBits-v0``, ``dppo/MatchDigits-v0``, ``dppo/DictMatch-v0``: the observation shows a random
  target, the action must reproduce it; reward per step is the fraction matched, 10 steps an episode
  (optimal return 10). They exercise MultiBinary, MultiDiscrete and Dict(image + Discrete) spaces with a
  task simple enough to learn in a few thousand steps.
- ``dppo/MaskedGrid-v0``: a grid with walls whose observation carries an ``action_mask`` of the legal moves
  (an illegal move ends the episode), for action masking.
- ``dppo/Frames-v0``: Atari-sized observations (84 x 84 x 4 uint8 frames, Discrete(4)) made for almost nothing, for
  benchmarks of what the frames cost to move (``dppo bench driver``); reward 1 per step.
- ``dppo/InfoCartPole-v0``: CartPole-v1 whose info carries figures of its own, for ``metrics.info_keys``: ``distance``
  (the cart's distance from the centre) every step, ``success`` (the pole stood ``success_steps`` steps) only where
  the pole falls, and ``label`` (a string: not a figure) every step.
- ``dppo/CueCorridor-v0``: a cue shown once, then a choice several steps later that must name it: a task only a
  policy with memory (``model.recurrent: lstm``) solves.
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class FramesEnv(gym.Env):
    """Frames the size of Atari's after preprocessing, one pixel telling the step apart: the cost is in moving them."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.frame = np.zeros((84, 84, 4), np.uint8)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.frame[0, 0, 0] = 0
        return self.frame.copy(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.frame[0, 0, 0] = (int(self.frame[0, 0, 0]) + 1) % 256
        return self.frame.copy(), 1.0, False, False, {}


class CounterEnv(gym.Env):
    def __init__(self, terminate_at: int | None = None) -> None:
        self.observation_space = gym.spaces.Box(0.0, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.terminate_at = terminate_at
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        terminated = self.terminate_at is not None and self.t >= self.terminate_at
        return np.array([float(self.t)], np.float32), 1.0, terminated, False, {}


class FaultyEnv(gym.Wrapper):
    """CartPole with an injected fault once this process has taken a number of steps.

    ``fail_at``: raise at that step; ``persistent``: keep raising from then on (a recreated env too).
    ``nan_at``: NaN observations from that step on. ``hang_at``: sleep ``hang_s`` at that step.
    ``token_file``: when set, only the process that first creates this file misbehaves, so one actor
    of many can be made faulty.
    """

    steps_in_process = 0
    armed: bool | None = None

    def __init__(self, fail_at: int | None = None, persistent: bool = False, nan_at: int | None = None,
                 hang_at: int | None = None, hang_s: float = 5.0, token_file: str | None = None) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.fail_at, self.persistent, self.nan_at = fail_at, persistent, nan_at
        self.hang_at, self.hang_s, self.token_file = hang_at, hang_s, token_file

    def _armed(self) -> bool:
        if FaultyEnv.armed is None:
            if self.token_file is None:
                FaultyEnv.armed = True
            else:
                try:
                    os.close(os.open(self.token_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                    FaultyEnv.armed = True
                except FileExistsError:
                    FaultyEnv.armed = False
        return FaultyEnv.armed

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        FaultyEnv.steps_in_process += 1
        n = FaultyEnv.steps_in_process
        armed = self._armed() if n in {self.fail_at, self.nan_at, self.hang_at} or self.persistent else FaultyEnv.armed
        if armed and self.fail_at is not None and (n == self.fail_at or (self.persistent and n >= self.fail_at)):
            raise RuntimeError(f"injected env failure at step {n}")
        if armed and self.hang_at is not None and n == self.hang_at:
            time.sleep(self.hang_s)
        obs, reward, terminated, truncated, info = self.env.step(action)
        if armed and self.nan_at is not None and n >= self.nan_at:
            obs = np.full_like(obs, np.nan)
        return obs, reward, terminated, truncated, info


class MatchEnv(gym.Env):
    """Reproduce the target the observation shows (see the module docstring); ``kind`` picks the spaces.

    - ``bits``: observation MultiBinary(4) target, action MultiBinary(4);
    - ``digits``: observation MultiDiscrete([3, 3, 3]) target, action MultiDiscrete([3, 3, 3]);
    - ``dict``: observation {"image": 36x36x1 uint8 with a bright quadrant q, "flip": Discrete(2) f},
      action Discrete(4), target q if f == 0 else 3 - q: the policy needs the CNN and the vector.
    """

    QUADRANT = 18

    def __init__(self, kind: str = "bits") -> None:
        self.kind = kind
        if kind == "bits":
            self.observation_space: gym.Space = gym.spaces.MultiBinary(4)
            self.action_space: gym.Space = gym.spaces.MultiBinary(4)
        elif kind == "digits":
            self.observation_space = gym.spaces.MultiDiscrete([3, 3, 3])
            self.action_space = gym.spaces.MultiDiscrete([3, 3, 3])
        elif kind == "dict":
            self.observation_space = gym.spaces.Dict({
                "image": gym.spaces.Box(0, 255, (36, 36, 1), np.uint8), "flip": gym.spaces.Discrete(2)})
            self.action_space = gym.spaces.Discrete(4)
        else:
            raise ValueError(f"kind must be bits, digits or dict, not {kind!r}")
        self.t = 0

    def _draw(self) -> Any:
        if self.kind == "bits":
            self.target = self.np_random.integers(0, 2, 4).astype(np.int8)
            return self.target.copy()
        if self.kind == "digits":
            self.target = self.np_random.integers(0, 3, 3)
            return self.target.copy()
        quadrant, flip = int(self.np_random.integers(4)), int(self.np_random.integers(2))
        self.target = np.array(quadrant if flip == 0 else 3 - quadrant)
        image = np.zeros((36, 36, 1), np.uint8)
        row, col = divmod(quadrant, 2)
        image[row * self.QUADRANT:(row + 1) * self.QUADRANT, col * self.QUADRANT:(col + 1) * self.QUADRANT] = 255
        return {"image": image, "flip": flip}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        reward = float(np.mean(np.asarray(action) == self.target))
        self.t += 1
        return self._draw(), reward, self.t >= 10, False, {}


class MaskedGrid(gym.Env):
    """A 5 x 5 grid with walls: walk from the top-left corner to the bottom-right one (+1, -0.01 a step). A move
    into a wall or off the grid ends the episode (-1). The observation carries ``action_mask``, 1 for each legal
    move, so a masked policy never makes one: the action-masking test and benchmark env."""

    WALLS = frozenset({(1, 1), (1, 2), (1, 3), (3, 1), (3, 2), (3, 3)})
    MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # up, down, left, right
    SIZE = 5

    def __init__(self, empty_mask_at: int | None = None) -> None:
        self.observation_space = gym.spaces.Dict({
            "position": gym.spaces.MultiDiscrete([self.SIZE, self.SIZE]), "action_mask": gym.spaces.MultiBinary(4)})
        self.action_space = gym.spaces.Discrete(4)
        self.position, self.t = (0, 0), 0
        self.empty_mask_at = empty_mask_at  # a broken env: from this step of an episode its mask allows nothing

    def _legal(self, position: tuple[int, int]) -> list[bool]:
        return [self._inside((position[0] + dr, position[1] + dc)) for dr, dc in self.MOVES]

    def _inside(self, cell: tuple[int, int]) -> bool:
        return 0 <= cell[0] < self.SIZE and 0 <= cell[1] < self.SIZE and cell not in self.WALLS

    def _obs(self) -> dict[str, np.ndarray]:
        legal = self._legal(self.position)
        if self.empty_mask_at is not None and self.t >= self.empty_mask_at:
            legal = [False] * len(legal)
        return {"position": np.array(self.position, np.int64), "action_mask": np.array(legal, np.int8)}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.position, self.t = (0, 0), 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        dr, dc = self.MOVES[int(action)]
        target = (self.position[0] + dr, self.position[1] + dc)
        if not self._inside(target):
            return self._obs(), -1.0, True, False, {"illegal": True}
        self.position = target
        done = target == (self.SIZE - 1, self.SIZE - 1)
        return self._obs(), 1.0 if done else -0.01, done, False, {}


class InfoCartPole(CartPoleEnv):
    """CartPole with figures of its own in its info (see the module docstring)."""

    def __init__(self, success_steps: int = 30) -> None:
        super().__init__()
        self.success_steps, self.t = success_steps, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        self.t = 0
        return super().reset(seed=seed, options=options)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, _ = super().step(action)
        self.t += 1
        info: dict[str, Any] = {"distance": abs(float(obs[0])), "label": "cart"}
        if terminated:
            info["success"] = self.t >= self.success_steps
        return obs, reward, terminated, truncated, info


class CueCorridor(gym.Env):
    """A memory task: the first observation shows a cue (-1 or +1), the next ``length`` show none, and the last
    step's action must name the cue (0 for -1, 1 for +1): reward +1 if it does, -1 if not. Observation: (cue,
    choose-now flag, steps taken / length). A feed-forward policy cannot beat a coin flip (expected return 0);
    one with memory gets 1."""

    def __init__(self, length: int = 5) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.length = length
        self.t, self.cue = 0, 1

    def _obs(self) -> np.ndarray:
        cue = float(self.cue) if self.t == 0 else 0.0
        return np.array([cue, float(self.t == self.length), self.t / self.length], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t, self.cue = 0, int(self.np_random.choice([-1, 1]))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.t < self.length:
            self.t += 1
            return self._obs(), 0.0, False, False, {}
        reward = 1.0 if (int(action) == 1) == (self.cue == 1) else -1.0
        return self._obs(), reward, True, False, {}
