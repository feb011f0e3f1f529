"""A network of one's own for dppo (``model.entry_point: examples.own_network.nets:ResidualMLP``, run from the
repository's root; from elsewhere put this directory on PYTHONPATH and name it ``nets:ResidualMLP``).

dppo calls ``ResidualMLP(observation_space, action_space, model_config)``; ``forward`` takes the observation as dppo
encodes it (one float vector per row; an image space's uint8 image first when it has one) and returns the action
head's output (logits here) and the value. Separate policy and value trunks, as dppo's own MLP has (CleanRL's
default), each a stack of pre-norm residual blocks.
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn

from dppo.rl.custom import head_width, input_shapes


def orthogonal(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class Block(nn.Module):
    """x + W2 tanh(W1 LayerNorm(x))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.inner = orthogonal(nn.Linear(width, width), math.sqrt(2))
        self.outer = orthogonal(nn.Linear(width, width), 0.1)  # small: each block starts near the identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.outer(torch.tanh(self.inner(self.norm(x))))


class Trunk(nn.Sequential):
    def __init__(self, inputs: int, width: int, blocks: int) -> None:
        super().__init__(orthogonal(nn.Linear(inputs, width), math.sqrt(2)), nn.Tanh(),
                         *(Block(width) for _ in range(blocks)))


class ResidualMLP(nn.Module):
    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: object,
                 width: int = 64, blocks: int = 2) -> None:
        super().__init__()
        inputs = sum(math.prod(shape) for shape in input_shapes(observation_space, config))
        self.policy, self.value = Trunk(inputs, width, blocks), Trunk(inputs, width, blocks)
        self.logits = orthogonal(nn.Linear(width, head_width(action_space)), 0.01)
        self.v = orthogonal(nn.Linear(width, 1), 1.0)

    def forward(self, *parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every input flattened (an image's pixels scaled to [0, 1]) and joined."""
        x = torch.cat([(p.float() / 255 if p.dtype == torch.uint8 else p).flatten(1) for p in parts], -1)
        return self.logits(self.policy(x)), self.v(self.value(x)).squeeze(-1)
