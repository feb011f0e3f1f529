"""Observation spaces: how every supported gymnasium space becomes network input.

Observations become an :class:`Obs`: at most one uint8 image (for the CNN) and one float32 vector holding
everything else, flattened in gymnasium's ``flatten`` order (Box as is, Discrete and MultiDiscrete one-hot,
MultiBinary as 0/1), which is what Stable-Baselines3's MultiInputPolicy feeds its networks. The numpy
encoding here is the actors' path; the torch model in :mod:`dppo.rl.model` reads the same description.
Action spaces are :mod:`dppo.rl.actions`; :func:`check_spaces` checks both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from dppo.errors import UnsupportedSpace
from dppo.rl.actions import ActionSpec, NoLegalAction

if TYPE_CHECKING:
    from dppo.config import ModelConfig

DEFAULT_MASK_KEY = "action_mask"  # the common convention: a Dict observation's action_mask key
WRAPPER_HINT = ("wrap the env (env.wrappers) so it has Box, Discrete, MultiDiscrete or MultiBinary spaces, "
                "or a Dict/Tuple of those")


def leaf_label(path: tuple[Any, ...]) -> str:
    """How a leaf of an observation is named in messages: obs, obs['image'], obs[0]['pos']."""
    return "obs" + "".join(f"[{key!r}]" for key in path)


def unsupported(space: gym.Space, path: tuple[Any, ...]) -> UnsupportedSpace:
    """The leaf dppo cannot encode, named by its path, with a fix that works for it: a Dict key can be dropped
    (FilterObservation keeps the others; MiniGrid's text `mission` is the common case)."""
    kind = type(space).__name__
    if path and isinstance(path[-1], str):
        return UnsupportedSpace(
            f"{leaf_label(path)}: {kind} cannot be encoded; drop that key with env.wrappers: [{{name: "
            f"FilterObservation, kwargs: {{filter_keys: [the keys to keep]}}}}] (for MiniGrid, "
            f"minigrid.wrappers:ImgObsWrapper keeps the image alone), or {WRAPPER_HINT}")
    return UnsupportedSpace(f"observation space {space} is not supported ({leaf_label(path)}: {kind}); {WRAPPER_HINT}")


def is_image(space: gym.Space) -> bool:
    """(H, W, C) or (C, H, W) uint8 boxes get the CNN; every other Box is flattened into the vector."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


@dataclass
class Obs:
    """A batch of encoded observations: ``image`` (B, H, W, C) uint8 and/or ``vector`` (B, D) float32, and the
    action ``mask`` (B, A) bool when the observation carries one.

    Works for numpy arrays and torch tensors alike; rows are indexed together.
    """

    image: Any = None
    vector: Any = None
    mask: Any = None

    def parts(self) -> dict[str, Any]:
        return {k: v for k, v in (("image", self.image), ("vector", self.vector), ("mask", self.mask))
                if v is not None}

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


def _leaf_width(space: gym.Space, path: tuple[Any, ...]) -> int:
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    if isinstance(space, gym.spaces.MultiBinary):
        return int(np.prod(space.shape))
    raise unsupported(space, path)


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


def stack(items: Sequence[Any], space: gym.Space) -> Any:
    """Per-sample observations (a list, or an object array from a vector env's info) -> one batch."""
    if isinstance(space, gym.spaces.Dict):
        return {key: stack([item[key] for item in items], sub) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(stack([item[i] for item in items], sub) for i, sub in enumerate(space.spaces))
    return np.stack([np.asarray(item) for item in items])


def take(batch: Any, rows: np.ndarray) -> Any:
    """Rows of a batched observation (arrays, dicts and tuples of them, or an object array of samples)."""
    if isinstance(batch, dict):
        return {key: take(value, rows) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(take(value, rows) for value in batch)
    return np.asarray(batch)[rows]


class ObsSpec:
    """Encodes batches of an observation space into :class:`Obs` (see the module docstring). ``mask_key`` names
    the Dict key that holds an action mask (see ModelConfig.action_mask_key): it becomes ``Obs.mask`` and, unless
    ``mask_in_network``, stays out of the network's input."""

    def __init__(self, space: gym.Space, mask_key: str | None = None, mask_in_network: bool = False,
                 value_only_key: str | None = None) -> None:
        self.space = space
        self.mask_key = mask_key if isinstance(space, gym.spaces.Dict) and mask_key in space.spaces else None
        if mask_key is not None and self.mask_key is None and mask_key != DEFAULT_MASK_KEY:
            keys = list(space.spaces) if isinstance(space, gym.spaces.Dict) else []
            raise UnsupportedSpace(f"model.action_mask_key={mask_key!r} is not a key of the observation "
                                   f"{keys or space}; name the key that holds the mask, or set it to null for no mask")
        self.mask_size = int(np.prod(space[self.mask_key].shape)) if self.mask_key else 0
        self.image_path: tuple[Any, ...] | None = None
        self.image_shape: tuple[int, ...] | None = None
        self.leaves: list[tuple[tuple[Any, ...], Leaf]] = []
        self._walk(space, (), skip=None if mask_in_network else self.mask_key)
        self.vector_dim = sum(leaf.width for _, leaf in self.leaves)
        self.policy_features = self._policy_features(value_only_key)  # indices into the encoded vector

    def _policy_features(self, value_only_key: str | None) -> np.ndarray | None:
        """The indices of the vector's features the policy sees: all but those of ``value_only_key``
        (model.value_only_key: a centralized critic's global state); None when the policy sees the whole vector."""
        if value_only_key is None:
            return None
        if not isinstance(self.space, gym.spaces.Dict) or value_only_key not in self.space.spaces:
            keys = list(self.space.spaces) if isinstance(self.space, gym.spaces.Dict) else self.space
            raise UnsupportedSpace(f"model.value_only_key={value_only_key!r} is not a key of the observation {keys}; "
                                   "name the key only the critic sees, or set it to null")
        if self.image_path is not None:
            raise UnsupportedSpace(f"model.value_only_key={value_only_key!r} works with vector observations, and "
                                   f"{self.space} holds an image; drop the critic-only key")
        columns, start = [], 0
        for path, leaf in self.leaves:
            if path[0] != value_only_key:
                columns.extend(range(start, start + leaf.width))
            start += leaf.width
        return np.asarray(columns, np.int64)

    def _walk(self, space: gym.Space, path: tuple[Any, ...], skip: str | None = None) -> None:
        if isinstance(space, gym.spaces.Dict):
            for key, sub in space.spaces.items():
                if not (path == () and key == skip):
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
            self.leaves.append((path, Leaf(space, _leaf_width(space, path))))

    @property
    def has_image(self) -> bool:
        return self.image_path is not None

    @property
    def has_vector(self) -> bool:
        return bool(self.leaves)

    @property
    def has_mask(self) -> bool:
        return self.mask_key is not None

    def empty(self, leading: tuple[int, ...]) -> Obs:
        """Uninitialized buffers for ``leading`` rows, e.g. (T, E) for a segment."""
        return Obs(
            image=np.empty((*leading, *self.image_shape), np.uint8) if self.has_image else None,
            vector=np.empty((*leading, self.vector_dim), np.float32) if self.has_vector else None,
            mask=np.empty((*leading, self.mask_size), bool) if self.has_mask else None,
        )

    def encode(self, batch: Any, out: Obs | None = None) -> Obs:
        """Encode a vector env's batched observation (leading dim B) into ``out`` or new arrays."""
        rows = len(_first_leaf(batch))
        out = out if out is not None else self.empty((rows,))
        if self.has_image:
            out.image[:] = at_path(batch, self.image_path)
        if self.has_vector:
            out.vector[:] = 0.0
            start = 0
            for path, leaf in self.leaves:
                _encode_leaf(leaf.space, at_path(batch, path), out.vector[:, start:start + leaf.width])
                start += leaf.width
        if self.has_mask:
            out.mask[:] = np.asarray(batch[self.mask_key]).reshape(rows, -1) != 0
        return out

    def encode_many(self, items: Sequence[Any]) -> Obs:
        """Encode a list of single observations (e.g. the final observations of finished episodes)."""
        return self.encode(stack(list(items), self.space))

    def encode_one(self, obs: Any) -> Obs:
        """Encode one observation as a batch of one row."""
        return self.encode_many([obs])

    def encode_rows(self, batch: Any, rows: np.ndarray) -> Obs:
        """Encode some rows of a batched observation; also takes a vector env's object array of samples."""
        if isinstance(batch, np.ndarray) and batch.dtype == object:
            return self.encode_many([batch[i] for i in rows])
        return self.encode(take(batch, rows))


def at_path(batch: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        batch = batch[key]
    return batch


def _first_leaf(batch: Any) -> Any:
    while isinstance(batch, (dict, tuple)):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return np.asarray(batch)


def check_spaces(obs_space: gym.Space, action_space: gym.Space,
                 model: ModelConfig | None = None) -> tuple[ObsSpec, ActionSpec]:
    """Both specs, or UnsupportedSpace naming the space and the fix (an action mask must fit the actions)."""
    mask_key = DEFAULT_MASK_KEY if model is None else model.action_mask_key
    obs_spec = ObsSpec(obs_space, mask_key, model is not None and model.mask_in_network,
                       None if model is None else model.value_only_key)
    action_spec = ActionSpec(action_space)
    if obs_spec.has_mask:
        label = leaf_label((obs_spec.mask_key,))
        if action_spec.kind != "categorical":
            raise UnsupportedSpace(f"{label} is an action mask, and masks apply to Discrete and MultiDiscrete actions, "
                                   f"not {action_space}; drop the key or set model.action_mask_key to null")
        if obs_spec.mask_size != action_spec.out_dim:
            raise UnsupportedSpace(f"{label} holds {obs_spec.mask_size} values, but {action_space} needs one per "
                                   f"action ({action_spec.out_dim}; for MultiDiscrete one per value of each component)")
    return obs_spec, action_spec


def check_first_observation(obs_spec: ObsSpec, action_spec: ActionSpec, obs: Any, env_name: str) -> None:
    """An env whose first observation's mask allows no action cannot be trained: bad input, named."""
    if obs_spec.has_mask:
        try:
            action_spec.apply_mask(np.zeros((1, action_spec.out_dim)), obs_spec.encode_one(obs).mask)
        except NoLegalAction as err:
            raise UnsupportedSpace(f"env {env_name!r}: the action mask of reset()'s observation "
                                   f"({leaf_label((obs_spec.mask_key,))}) allows no action ({err}); every "
                                   "observation must allow at least one") from None
