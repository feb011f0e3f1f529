"""Agent: numpy observations in, actions, log-probs and values out; weights loaded by version.

For MLP policies the forward pass runs in numpy: an actor's batch is only E rows, where torch's per-op
dispatch (several microseconds per op) costs more than the math. It runs in float64 and returns float32,
so a row's result does not depend on the batch it came in (BLAS sums in a different order for one row
than for many; a truncated episode's V(final obs) must equal V of the same obs elsewhere). Image
policies (the CNN) use torch. Both paths compute the same function; tests compare them.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dppo.config import ModelConfig
from dppo.model import ActorCritic, is_image

Weights = dict[str, np.ndarray]
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def export_weights(model: torch.nn.Module) -> Weights:
    """State dict as numpy arrays: zero-copy through Ray's object store."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def _numpy_layers(net: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W^T, b) of each Linear as float64 copies."""
    return [(m.weight.detach().numpy().T.astype(np.float64), m.bias.detach().numpy().astype(np.float64))
            for m in net if isinstance(m, nn.Linear)]


class Agent:
    """Acts with the current policy in batches over E envs; no gradients, one version at a time."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig) -> None:
        self.model = ActorCritic(obs_space, action_space, config)
        self.model.eval()
        self.version = -1
        self.obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 else torch.float32
        self.fast = not is_image(obs_space)
        self.relu = config.activation == "relu"
        # Seeded from torch's generator, so torch.manual_seed(seed) still makes an actor reproducible.
        self.rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        self._copy_weights()

    def load(self, weights: Weights, version: int) -> None:
        """Load weights unless this version is already loaded."""
        if version == self.version:
            return
        self.model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()})
        self._copy_weights()
        self.version = version

    def _copy_weights(self) -> None:
        if self.fast:
            self.policy_layers = _numpy_layers(self.model.policy_head)
            self.value_layers = _numpy_layers(self.model.value_head)
            if not self.model.discrete:
                self.log_std = self.model.log_std.detach().numpy().astype(np.float64)

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, dtype=self.obs_dtype)

    def _mlp(self, layers: list[tuple[np.ndarray, np.ndarray]], obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, np.float64).reshape(len(obs), -1)
        for weight_t, bias in layers[:-1]:
            x = x @ weight_t
            x += bias
            if self.relu:
                np.maximum(x, 0, out=x)
            else:
                np.tanh(x, out=x)
        weight_t, bias = layers[-1]
        return x @ weight_t + bias

    def act(self, obs: np.ndarray, greedy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample (or pick the mode of) actions for a batch: (actions, log_probs, values)."""
        if not self.fast:
            return self._act_torch(obs, greedy)
        out = self._mlp(self.policy_layers, obs)
        value = self._mlp(self.value_layers, obs)[:, 0].astype(np.float32)
        if self.model.discrete:
            logits = out - out.max(axis=1, keepdims=True)
            log_norm = np.log(np.exp(logits).sum(axis=1, keepdims=True))
            log_probs = logits - log_norm
            if greedy:
                action = log_probs.argmax(axis=1)
            else:  # inverse CDF: one uniform per row
                cdf = np.exp(log_probs).cumsum(axis=1)
                u = self.rng.random((len(out), 1)) * cdf[:, -1:]
                action = np.minimum((u >= cdf).sum(axis=1), out.shape[1] - 1)
            return action.astype(np.int64), log_probs[np.arange(len(out)), action].astype(np.float32), value
        # the action is rounded to float32 first: the trainer scores exactly the action that was stored
        noise = 0.0 if greedy else np.exp(self.log_std) * self.rng.standard_normal(out.shape)
        action = (out + noise).astype(np.float32)
        z = (action - out) * np.exp(-self.log_std)
        log_prob = (-0.5 * z * z - self.log_std - _LOG_SQRT_2PI).sum(axis=1).astype(np.float32)
        return action.reshape(len(out), *self.model.action_shape), log_prob, value

    @torch.inference_mode()
    def _act_torch(self, obs: np.ndarray, greedy: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dist, value = self.model(self._tensor(obs))
        if greedy:
            action = dist.probs.argmax(-1) if self.model.discrete else dist.mean
        else:
            action = dist.sample()
        log_prob = self.model.log_prob(dist, action)
        return action.numpy(), log_prob.numpy(), value.numpy()

    def value(self, obs: np.ndarray) -> np.ndarray:
        if self.fast:
            return self._mlp(self.value_layers, obs)[:, 0].astype(np.float32)
        with torch.inference_mode():
            return self.model.value(self._tensor(obs)).numpy()
