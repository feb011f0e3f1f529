"""The deterministic policy as one torch module, for deployment: the env's raw observation in, the env's action out.

For every space dppo supports: inputs are the observation's leaves in gymnasium's flatten order (named ``obs``
for a plain space, else by their Dict keys / Tuple indices, e.g. ``obs.image``, ``obs.1``), each with a batch
dimension; the encoding (one-hot, flattening), the observation normalization and the policy's mode (argmax,
p > 0.5, the Gaussian mean clipped to the bounds) are inside the graph. ``dppo export`` writes it as ONNX or
TorchScript. The normalization here is the torch twin of :class:`dppo.rl.transforms.ObsNormalizer`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dppo.rl.actions import MASKED_LOGIT
from dppo.rl.model import ActorCritic
from dppo.rl.normalizer import RunningStats
from dppo.rl.spaces import Obs, at_path, stack

STATE_INPUTS = ("state.h", "state.c")
STATE_OUTPUTS = ("next_state.h", "next_state.c")


def leaf_name(path: tuple[Any, ...]) -> str:
    return ".".join(["obs", *(str(p) for p in path)])


class DeterministicPolicy(nn.Module):
    """Raw observation leaves in (the image first when there is one), the env's action out."""

    def __init__(self, model: ActorCritic, obs_stats: RunningStats | None, obs_clip: float) -> None:
        super().__init__()
        self.model = model.eval()
        self.obs_spec, self.action_spec = model.obs_spec, model.action_spec
        self.leaves = [leaf.space for _, leaf in self.obs_spec.leaves]
        for i, space in enumerate(self.leaves):  # the values each one-hot block compares against
            if isinstance(space, gym.spaces.Discrete):
                self.register_buffer(f"values_{i}", torch.arange(int(space.n)) + int(space.start))
            elif isinstance(space, gym.spaces.MultiDiscrete):
                self.register_buffer(f"values_{i}", torch.as_tensor(np.concatenate(
                    [np.arange(n) + s for n, s in zip(space.nvec.reshape(-1), space.start.reshape(-1), strict=True)])))
                self.register_buffer(f"columns_{i}", torch.as_tensor(np.repeat(
                    np.arange(space.nvec.size), space.nvec.reshape(-1))))
        self.normalize = obs_stats is not None
        if obs_stats is not None:
            self.register_buffer("mean", torch.as_tensor(obs_stats.mean, dtype=torch.float32))
            self.register_buffer("std", torch.as_tensor(np.sqrt(obs_stats.var + 1e-8), dtype=torch.float32))
        self.obs_clip = float(obs_clip)
        self.recurrent = model.recurrent
        space = self.action_spec.space
        if self.action_spec.kind == "gaussian":
            self.register_buffer("low", torch.as_tensor(space.low.reshape(-1), dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(space.high.reshape(-1), dtype=torch.float32))
        elif self.action_spec.kind == "categorical":
            self.register_buffer("start", torch.as_tensor(np.asarray(space.start).reshape(-1), dtype=torch.int64))

    def input_paths(self) -> list[tuple[Any, ...]]:
        """The observation's leaves the graph takes, in order: the image, the vector's leaves, the action mask
        (one input when the mask is also a leaf of the vector)."""
        spec = self.obs_spec
        paths = ([spec.image_path] if spec.has_image else []) + [path for path, _ in spec.leaves]
        if spec.has_mask and (spec.mask_key,) not in paths:
            paths.append((spec.mask_key,))
        return paths

    def input_names(self) -> list[str]:
        """The observation's leaves, then (recurrent policies) the LSTM state: zeros at an episode's start."""
        return [leaf_name(path) for path in self.input_paths()] + (list(STATE_INPUTS) if self.recurrent else [])

    def output_names(self) -> list[str]:
        """The action, then (recurrent policies) the LSTM state to pass in with the next observation."""
        return ["action", *(STATE_OUTPUTS if self.recurrent else ())]

    def _encode(self, i: int, space: gym.Space, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if isinstance(space, gym.spaces.Discrete):
            return (x.reshape(rows, 1) == getattr(self, f"values_{i}")).float()
        if isinstance(space, gym.spaces.MultiDiscrete):
            picked = x.reshape(rows, -1)[:, getattr(self, f"columns_{i}")]  # each column's value, per block
            return (picked == getattr(self, f"values_{i}")).float()
        return x.reshape(rows, -1).float()

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.recurrent:
            *obs_inputs, h, c = inputs
            features, (h, c) = self.model.lstm(self.features(*obs_inputs)[None], (h[None], c[None]))
            return self.action(features[0], *obs_inputs), h[0], c[0]
        return self.action(self.features(*inputs), *inputs)

    def features(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The encoder's output for the raw observation leaves (encoded and normalized here)."""
        image = inputs[0] if self.obs_spec.has_image else None
        leaves = inputs[1:] if self.obs_spec.has_image else inputs
        leaves = leaves[:len(self.leaves)]
        vector = None
        if leaves:
            vector = torch.cat([self._encode(i, s, x) for i, (s, x) in enumerate(zip(self.leaves, leaves,
                                                                                      strict=True))], -1)
            if self.normalize:
                vector = ((vector - self.mean) / self.std).clamp(-self.obs_clip, self.obs_clip)
        return self.model.features(Obs(image=image, vector=vector))

    def action(self, features: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        """The policy's mode, never a masked action."""
        out = self.model.policy_head(self.model.policy_input(features))
        mask = inputs[self.input_paths().index((self.obs_spec.mask_key,))] if self.obs_spec.has_mask else None
        if mask is not None:  # the masked actions are never the mode
            out = out.masked_fill(mask.reshape(out.shape) == 0, MASKED_LOGIT)
        spec = self.action_spec
        rows = out.shape[0]
        if spec.kind == "categorical":
            choice = torch.stack([part.argmax(-1) for part in out.split(spec.nvec, -1)], -1) + self.start
            return choice.reshape(rows, *spec.stored_shape)
        if spec.kind == "bernoulli":
            return (out > 0).to(torch.int8).reshape(rows, *spec.stored_shape)
        return torch.minimum(torch.maximum(out, self.low), self.high).reshape(rows, *spec.stored_shape)


def example_inputs(policy: DeterministicPolicy, rows: int = 2, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random observations of the env's space, one tensor per input (for tracing and for tests)."""
    space = policy.obs_spec.space
    space.seed(seed)
    batch = stack([space.sample() for _ in range(rows)], space)
    if policy.obs_spec.has_mask:  # every row allows some action
        batch[policy.obs_spec.mask_key][..., 0] = 1
    inputs = tuple(torch.as_tensor(np.asarray(at_path(batch, p))) for p in policy.input_paths())
    if policy.recurrent:  # the state at an episode's start
        inputs += tuple(torch.zeros(rows, policy.model.hidden_size) for _ in STATE_INPUTS)
    return inputs
