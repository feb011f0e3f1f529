"""Model: the actor-critic networks. No optimizer here (the Trainer owns it; actors only get weights)."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn
from torch.distributions import Bernoulli, Categorical, Distribution, Normal

from dppo.config import ModelConfig
from dppo.rl.actions import MASKED_LOGIT, ActionSpec
from dppo.rl.encoders import ImageEncoder, image_encoder, layer_init
from dppo.rl.spaces import Obs, check_spaces


class Tanh(nn.Module):
    """tanh(x) computed as 2 sigmoid(2x) - 1: the same function, but torch's CPU tanh kernel is several
    times slower than its sigmoid at these sizes (80 vs 9 us on 512 x 64 here), and it was a fifth of the
    PPO update's time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(2 * x) * 2 - 1


ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": Tanh, "relu": nn.ReLU}


def mlp(in_dim: int, hidden: list[int], out_dim: int, activation: str, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_dim, width), math.sqrt(2)), ACTIVATIONS[activation]()]
        in_dim = width
    layers.append(layer_init(nn.Linear(in_dim, out_dim), out_gain))
    return nn.Sequential(*layers)


class ActionDist:
    """The policy's distribution over one action: independent parts whose log-probs and entropies add.

    Categorical parts for Discrete/MultiDiscrete, Bernoullis for MultiBinary, a diagonal Gaussian for Box
    (see :class:`dppo.rl.actions.ActionSpec`). Argument validation is off: it costs more than the math here.
    """

    def __init__(self, spec: ActionSpec, out: torch.Tensor, log_std: torch.Tensor | None,
                 mask: torch.Tensor | None = None) -> None:
        self.spec = spec
        self.rows = out.shape[0]
        if mask is not None:  # masked actions: probability 0 (see dppo.rl.actions.MASKED_LOGIT)
            out = out.masked_fill(~mask.reshape(out.shape).bool(), MASKED_LOGIT)
        if spec.kind == "categorical":
            self.parts: list[Distribution] = [Categorical(logits=logits, validate_args=False)
                                              for logits in out.split(spec.nvec, dim=-1)]
        elif spec.kind == "bernoulli":
            self.parts = [Bernoulli(logits=out, validate_args=False)]
        else:
            self.parts = [Normal(out, log_std.exp().expand_as(out), validate_args=False)]

    def _flat(self, actions: torch.Tensor) -> torch.Tensor:
        return actions.reshape(self.rows, -1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        flat = self._flat(actions)
        if self.spec.kind == "categorical":
            if len(self.parts) == 1:
                return self.parts[0].log_prob(flat[:, 0])
            return torch.stack([d.log_prob(flat[:, j]) for j, d in enumerate(self.parts)], -1).sum(-1)
        return self.parts[0].log_prob(flat.to(self.parts[0].mean.dtype)).sum(-1)

    def entropy(self) -> torch.Tensor:
        if self.spec.kind == "categorical" and len(self.parts) == 1:
            return self.parts[0].entropy()
        return torch.cat([d.entropy().reshape(self.rows, -1) for d in self.parts], -1).sum(-1)

    def _shape(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.reshape(self.rows, *self.spec.stored_shape)

    def mode(self) -> torch.Tensor:
        """The deterministic action (argmax, p > 0.5, or the mean), in the stored form."""
        if self.spec.kind == "categorical":
            return self._shape(torch.stack([d.logits.argmax(-1) for d in self.parts], -1))
        if self.spec.kind == "bernoulli":
            return self._shape((self.parts[0].logits > 0).long())
        return self._shape(self.parts[0].mean)

    def sample(self) -> torch.Tensor:
        if self.spec.kind == "categorical":
            return self._shape(torch.stack([d.sample() for d in self.parts], -1))
        if self.spec.kind == "bernoulli":
            return self._shape(self.parts[0].sample().long())
        return self._shape(self.parts[0].sample())


class ActorCritic(nn.Module):
    """Policy and value networks for every space :mod:`dppo.rl.spaces` encodes.

    Vector observations get separate policy and value MLPs (CleanRL's default); an image alone gets a
    shared NatureCNN trunk with two linear heads (a small image: the small CNN or the flattened pixels, then
    the MLP heads; :mod:`dppo.rl.encoders`); an image plus vectors gets the image features with the vector
    concatenated after them, then the MLP heads (Stable-Baselines3's MultiInputPolicy).
    Continuous policies are diagonal Gaussians with a state-independent log-std.
    """

    recurrent = False

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig,
                 head_inputs: int | None = None) -> None:
        """``head_inputs``: the width the heads take when something (an LSTM) sits between features and heads."""
        super().__init__()
        self.obs_spec, self.action_spec = check_spaces(obs_space, action_space, config)
        self.discrete = self.action_spec.discrete
        out_dim = self.action_spec.out_dim
        self.encoder: ImageEncoder | None = None
        if self.obs_spec.has_image:
            self.encoder = image_encoder(self.obs_spec.image_shape, config.encoder)
        self.feature_dim = self.obs_spec.vector_dim + (self.encoder.out_dim if self.encoder is not None else 0)
        width = head_inputs or self.feature_dim
        columns = self.obs_spec.policy_features  # a centralized critic's global state: the value head's alone
        self.policy_features = None if columns is None else nn.Buffer(torch.as_tensor(columns), persistent=False)
        if self.obs_spec.has_vector or self.encoder.kind != "nature":
            policy_width = width if columns is None else len(columns)
            self.policy_head: nn.Module = mlp(policy_width, config.hidden_sizes, out_dim, config.activation, 0.01)
            self.value_head: nn.Module = mlp(width, config.hidden_sizes, 1, config.activation, 1.0)
        else:  # NatureCNN's own 512-unit layer is the hidden layer (CleanRL's Atari agent)
            self.policy_head = layer_init(nn.Linear(width, out_dim), 0.01)
            self.value_head = layer_init(nn.Linear(width, 1), 1.0)
        if self.action_spec.kind == "gaussian":
            self.log_std = nn.Parameter(torch.full((out_dim,), float(config.init_log_std)))

    def as_obs(self, obs: Obs | torch.Tensor) -> Obs:
        """A bare tensor is the image (image-only spaces) or the encoded vector."""
        if isinstance(obs, Obs):
            return obs
        if self.obs_spec.has_image and not self.obs_spec.has_vector:
            return Obs(image=obs)
        return Obs(vector=obs.reshape(obs.shape[0], -1))

    def features(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        obs = self.as_obs(obs)
        if self.encoder is None:
            return obs.vector.float()
        image = self.encoder(obs.image)
        return image if obs.vector is None else torch.cat([image, obs.vector.float()], -1)

    def policy_input(self, features: torch.Tensor) -> torch.Tensor:
        """What the policy head sees of the features: all of them, or all but the critic-only key's columns."""
        return features if self.policy_features is None else features.index_select(-1, self.policy_features)

    def distribution(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> ActionDist:
        return ActionDist(self.action_spec, self.policy_head(self.policy_input(features)),
                          getattr(self, "log_std", None), mask)

    @staticmethod
    def log_prob(dist: ActionDist, actions: torch.Tensor) -> torch.Tensor:
        return dist.log_prob(actions)

    @staticmethod
    def entropy(dist: ActionDist) -> torch.Tensor:
        return dist.entropy()

    def forward(self, obs: Obs | torch.Tensor) -> tuple[ActionDist, torch.Tensor]:
        """Action distribution and V(obs) for a batch of observations."""
        obs = self.as_obs(obs)
        features = self.features(obs)
        return self.distribution(features, obs.mask), self.value_head(features).squeeze(-1)

    def value(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        return self.value_head(self.features(obs)).squeeze(-1)

    def evaluate(self, obs: Obs | torch.Tensor, actions: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi(a|s), entropy and V(s) for the trainer."""
        dist, value = self(obs)
        return dist.log_prob(actions), dist.entropy(), value


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
