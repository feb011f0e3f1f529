"""Model: the actor-critic networks. No optimizer here (the Trainer owns it; actors only get weights)."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Normal

from dppo.config import ModelConfig
from dppo.rl.agent import is_image


class Tanh(nn.Module):
    """tanh(x) computed as 2 sigmoid(2x) - 1: the same function, but torch's CPU tanh kernel is several
    times slower than its sigmoid at these sizes (80 vs 9 us on 512 x 64 here), and it was a fifth of the
    PPO update's time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(2 * x) * 2 - 1


ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": Tanh, "relu": nn.ReLU}


def layer_init(layer: nn.Module, gain: float, bias: float = 0.0) -> nn.Module:
    """Orthogonal weights, constant bias: sqrt(2) hidden, 0.01 policy head, 1.0 value head."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: list[int], out_dim: int, activation: str, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_dim, width), math.sqrt(2)), ACTIVATIONS[activation]()]
        in_dim = width
    layers.append(layer_init(nn.Linear(in_dim, out_dim), out_gain))
    return nn.Sequential(*layers)


class NatureCNN(nn.Module):
    """The DQN/PPO Atari encoder (Mnih et al. 2015) for (H, W, C) or (C, H, W) uint8 images."""

    def __init__(self, shape: tuple[int, ...], out_dim: int = 512) -> None:
        super().__init__()
        self.channels_last = shape[-1] <= 4 and shape[0] > 4
        channels = shape[-1] if self.channels_last else shape[0]
        self.net = nn.Sequential(
            layer_init(nn.Conv2d(channels, 32, 8, stride=4), math.sqrt(2)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1), math.sqrt(2)), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.net(torch.zeros(1, channels, *self._spatial(shape))).shape[1]
        self.head = nn.Sequential(layer_init(nn.Linear(flat, out_dim), math.sqrt(2)), nn.ReLU())

    def _spatial(self, shape: tuple[int, ...]) -> tuple[int, int]:
        return (shape[0], shape[1]) if self.channels_last else (shape[1], shape[2])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / 255.0
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.head(self.net(x))


class ActorCritic(nn.Module):
    """Policy and value networks for a Discrete or Box action space.

    MLP observations get separate policy and value MLPs (CleanRL's default); image observations get a
    shared NatureCNN trunk with two linear heads. Continuous policies are diagonal Gaussians with a
    state-independent log-std.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if not self.discrete and not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"action space {action_space} is not supported; use Discrete or Box")
        out_dim = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.action_shape: tuple[int, ...] = () if self.discrete else tuple(action_space.shape)
        if is_image(obs_space):
            self.encoder: nn.Module = NatureCNN(tuple(obs_space.shape))
            self.policy_head: nn.Module = layer_init(nn.Linear(512, out_dim), 0.01)
            self.value_head: nn.Module = layer_init(nn.Linear(512, 1), 1.0)
        else:
            in_dim = int(np.prod(obs_space.shape))
            self.encoder = nn.Flatten()
            self.policy_head = mlp(in_dim, config.hidden_sizes, out_dim, config.activation, 0.01)
            self.value_head = mlp(in_dim, config.hidden_sizes, 1, config.activation, 1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((out_dim,), float(config.init_log_std)))

    def distribution(self, features: torch.Tensor) -> Distribution:
        out = self.policy_head(features)
        if self.discrete:  # argument validation costs more than the math at these sizes
            return Categorical(logits=out, validate_args=False)
        return Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def log_prob(self, dist: Distribution, actions: torch.Tensor) -> torch.Tensor:
        lp = dist.log_prob(actions)
        return lp if self.discrete else lp.sum(-1)

    def entropy(self, dist: Distribution) -> torch.Tensor:
        ent = dist.entropy()
        return ent if self.discrete else ent.sum(-1)

    def forward(self, obs: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        """Action distribution and V(obs) for a batch of observations."""
        features = self.encoder(obs)
        return self.distribution(features), self.value_head(features).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_head(self.encoder(obs)).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi(a|s), entropy and V(s) for the trainer."""
        dist, value = self(obs)
        return self.log_prob(dist, actions), self.entropy(dist), value


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
