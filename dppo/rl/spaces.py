"""Spaces: how every supported gymnasium space becomes network input, and network output becomes actions.

The one place that knows about spaces. Observations become an :class:`Obs`: at most one uint8 image
(for the CNN) and one float32 vector holding everything else, flattened in gymnasium's ``flatten``
order (Box as is, Discrete and MultiDiscrete one-hot, MultiBinary as 0/1), which is what
Stable-Baselines3's MultiInputPolicy feeds its networks. Actions are one or more independent
distributions over the policy head's output: categoricals (Discrete, MultiDiscrete), Bernoullis
(MultiBinary) or a diagonal Gaussian (Box). The numpy functions here are the actors' fast path; the
torch model in :mod:`dppo.rl.model` computes the same functions (tests compare them on every space).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from dppo.errors import UsageError

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
WRAPPER_HINT = ("wrap the env (env.wrappers) so it has Box, Discrete, MultiDiscrete or MultiBinary spaces, "
                "or a Dict/Tuple of those, e.g. gymnasium.wrappers:FlattenObservation")


class UnsupportedSpace(UsageError):
    """An env space dppo cannot encode: bad input, with the fix in the message."""


def is_image(space: gym.Space) -> bool:
    """(H, W, C) or (C, H, W) uint8 boxes get the CNN; every other Box is flattened into the vector."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


@dataclass
class Obs:
    """A batch of encoded observations: ``image`` (B, H, W, C) uint8 and/or ``vector`` (B, D) float32.

    Works for numpy arrays and torch tensors alike; rows are indexed together.
    """

    image: Any = None
    vector: Any = None

    def parts(self) -> dict[str, Any]:
        return {k: v for k, v in (("image", self.image), ("vector", self.vector)) if v is not None}

    def map(self, fn: Callable[[Any], Any]) -> Obs:
        return Obs(**{k: fn(v) for k, v in self.parts().items()})

    def __getitem__(self, index: Any) -> Obs:
        return self.map(lambda part: part[index])

    def __len__(self) -> int:
        return len(next(iter(self.parts().values())))


@dataclass(frozen=True)
class Leaf:
    """One non-image leaf of the observation space and its slice of the vector."""

    space: gym.Space
    width: int


def _leaf_width(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    if isinstance(space, gym.spaces.MultiBinary):
        return int(np.prod(space.shape))
    raise UnsupportedSpace(f"observation space {space} is not supported; {WRAPPER_HINT}")


def _encode_leaf(space: gym.Space, batch: np.ndarray, out: np.ndarray) -> None:
    """Write a batch of one leaf's values into ``out`` (B, width), which starts zeroed."""
    rows = len(out)
    if isinstance(space, gym.spaces.Discrete):
        out[np.arange(rows), np.asarray(batch, np.int64).reshape(rows) - int(space.start)] = 1.0
    elif isinstance(space, gym.spaces.MultiDiscrete):
        values = (np.asarray(batch, np.int64) - space.start).reshape(rows, -1)
        offsets = np.concatenate([[0], np.cumsum(space.nvec.reshape(-1))[:-1]])
        out[np.arange(rows)[:, None], offsets + values] = 1.0
    else:  # Box and MultiBinary: the values themselves
        out[:] = np.asarray(batch).reshape(rows, -1)


def _stack(items: Sequence[Any], space: gym.Space) -> Any:
    """Per-sample observations (a list, or an object array from a vector env's info) -> one batch."""
    if isinstance(space, gym.spaces.Dict):
        return {key: _stack([item[key] for item in items], sub) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_stack([item[i] for item in items], sub) for i, sub in enumerate(space.spaces))
    return np.stack([np.asarray(item) for item in items])


def take(batch: Any, rows: np.ndarray) -> Any:
    """Rows of a batched observation (arrays, dicts and tuples of them, or an object array of samples)."""
    if isinstance(batch, dict):
        return {key: take(value, rows) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(take(value, rows) for value in batch)
    return np.asarray(batch)[rows]


class ObsSpec:
    """Encodes batches of an observation space into :class:`Obs` (see the module docstring)."""

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        self.image_path: tuple[Any, ...] | None = None
        self.image_shape: tuple[int, ...] | None = None
        self.leaves: list[tuple[tuple[Any, ...], Leaf]] = []
        self._walk(space, ())
        self.vector_dim = sum(leaf.width for _, leaf in self.leaves)

    def _walk(self, space: gym.Space, path: tuple[Any, ...]) -> None:
        if isinstance(space, gym.spaces.Dict):
            for key, sub in space.spaces.items():
                self._walk(sub, (*path, key))
        elif isinstance(space, gym.spaces.Tuple):
            for index, sub in enumerate(space.spaces):
                self._walk(sub, (*path, index))
        elif is_image(space):
            if self.image_path is not None:
                raise UnsupportedSpace(f"observation space {self.space} holds more than one image; dppo feeds one "
                                       "image to its CNN: stack them into one Box or drop one with a wrapper")
            self.image_path, self.image_shape = path, tuple(space.shape)
        else:
            self.leaves.append((path, Leaf(space, _leaf_width(space))))

    @property
    def has_image(self) -> bool:
        return self.image_path is not None

    @property
    def has_vector(self) -> bool:
        return bool(self.leaves)

    def empty(self, leading: tuple[int, ...]) -> Obs:
        """Uninitialized buffers for ``leading`` rows, e.g. (T, E) for a segment."""
        return Obs(
            image=np.empty((*leading, *self.image_shape), np.uint8) if self.has_image else None,
            vector=np.empty((*leading, self.vector_dim), np.float32) if self.has_vector else None,
        )

    def encode(self, batch: Any, out: Obs | None = None) -> Obs:
        """Encode a vector env's batched observation (leading dim B) into ``out`` or new arrays."""
        rows = len(_first_leaf(batch))
        out = out if out is not None else self.empty((rows,))
        if self.has_image:
            out.image[:] = _at(batch, self.image_path)
        if self.has_vector:
            out.vector[:] = 0.0
            start = 0
            for path, leaf in self.leaves:
                _encode_leaf(leaf.space, _at(batch, path), out.vector[:, start:start + leaf.width])
                start += leaf.width
        return out

    def encode_many(self, items: Sequence[Any]) -> Obs:
        """Encode a list of single observations (e.g. the final observations of finished episodes)."""
        return self.encode(_stack(list(items), self.space))

    def encode_one(self, obs: Any) -> Obs:
        """Encode one observation as a batch of one row."""
        return self.encode_many([obs])

    def encode_rows(self, batch: Any, rows: np.ndarray) -> Obs:
        """Encode some rows of a batched observation; also takes a vector env's object array of samples."""
        if isinstance(batch, np.ndarray) and batch.dtype == object:
            return self.encode_many([batch[i] for i in rows])
        return self.encode(take(batch, rows))


def _at(batch: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        batch = batch[key]
    return batch


def _first_leaf(batch: Any) -> Any:
    while isinstance(batch, (dict, tuple)):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return np.asarray(batch)


def log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    """log(sigmoid(x)), stable for large |x|."""
    return -np.logaddexp(0.0, -x)


class ActionSpec:
    """The action distribution of a space, its stored form, and the conversion to what the env takes.

    - Discrete(n): one categorical, stored as int64 index (start subtracted);
    - MultiDiscrete(nvec): independent categoricals, stored as int64 of shape nvec.shape;
    - MultiBinary(shape): independent Bernoullis, stored as int64 0/1 of that shape;
    - Box(shape): diagonal Gaussian with state-independent log-std, stored unclipped as float32, clipped
      to the bounds only when sent to the env.
    """

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        if isinstance(space, gym.spaces.Discrete):
            self.kind, self.nvec, self.stored_shape = "categorical", [int(space.n)], ()
        elif isinstance(space, gym.spaces.MultiDiscrete):
            self.kind, self.nvec = "categorical", [int(n) for n in space.nvec.reshape(-1)]
            self.stored_shape = tuple(space.nvec.shape)
        elif isinstance(space, gym.spaces.MultiBinary):
            self.kind, self.nvec, self.stored_shape = "bernoulli", [], tuple(space.shape)
        elif isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):
            self.kind, self.nvec, self.stored_shape = "gaussian", [], tuple(space.shape)
        else:
            raise UnsupportedSpace(f"action space {space} is not supported; use Discrete, MultiDiscrete, "
                                   "MultiBinary or a float Box (wrap the env's actions with an ActionWrapper)")
        self.out_dim = sum(self.nvec) if self.kind == "categorical" else int(np.prod(self.stored_shape))
        self.stored_dtype = np.float32 if self.kind == "gaussian" else np.int64

    @property
    def discrete(self) -> bool:
        return self.kind != "gaussian"

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """Stored actions (B, ...) -> the values the env's action space holds."""
        space = self.space
        if self.kind == "gaussian":
            return np.clip(actions, space.low, space.high)
        if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            return (actions + space.start).astype(space.dtype)
        return actions.astype(space.dtype)

    def sample(self, out: np.ndarray, log_std: np.ndarray | None, rng: np.random.Generator,
               greedy: bool) -> tuple[np.ndarray, np.ndarray]:
        """(actions, log-probs) from the policy head's output (B, out_dim), float64 math."""
        rows = len(out)
        if self.kind == "categorical":
            actions = np.empty((rows, len(self.nvec)), np.int64)
            log_prob = np.zeros(rows)
            start = 0
            for j, n in enumerate(self.nvec):
                logp = log_softmax(out[:, start:start + n])
                if greedy:
                    choice = logp.argmax(axis=1)
                else:  # inverse CDF: one uniform per row
                    cdf = np.exp(logp).cumsum(axis=1)
                    u = rng.random((rows, 1)) * cdf[:, -1:]
                    choice = np.minimum((u >= cdf).sum(axis=1), n - 1)
                actions[:, j] = choice
                log_prob += logp[np.arange(rows), choice]
                start += n
            return actions.reshape(rows, *self.stored_shape), log_prob.astype(np.float32)
        if self.kind == "bernoulli":
            actions = (out > 0) if greedy else (rng.random(out.shape) < 1.0 / (1.0 + np.exp(-out)))
            actions = actions.astype(np.int64)
            return actions.reshape(rows, *self.stored_shape), self.log_prob(out, log_std, actions)
        # the action is rounded to float32 first: the trainer scores exactly the action that was stored
        noise = 0.0 if greedy else np.exp(log_std) * rng.standard_normal(out.shape)
        actions = (out + noise).astype(np.float32)
        return actions.reshape(rows, *self.stored_shape), self.log_prob(out, log_std, actions)

    def log_prob(self, out: np.ndarray, log_std: np.ndarray | None, actions: np.ndarray) -> np.ndarray:
        """log pi(actions) summed over the independent parts, float32."""
        rows = len(out)
        flat = np.asarray(actions).reshape(rows, -1)
        if self.kind == "categorical":
            total = np.zeros(rows)
            start = 0
            for j, n in enumerate(self.nvec):
                total += log_softmax(out[:, start:start + n])[np.arange(rows), flat[:, j]]
                start += n
            return total.astype(np.float32)
        if self.kind == "bernoulli":
            return (flat * log_sigmoid(out) + (1 - flat) * log_sigmoid(-out)).sum(axis=1).astype(np.float32)
        z = (flat - out) * np.exp(-log_std)
        return (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(axis=1).astype(np.float32)


def check_spaces(obs_space: gym.Space, action_space: gym.Space) -> tuple[ObsSpec, ActionSpec]:
    """Both specs, or UnsupportedSpace naming the space and the fix."""
    return ObsSpec(obs_space), ActionSpec(action_space)
