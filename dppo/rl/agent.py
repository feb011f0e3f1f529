"""Agent: numpy observations in, actions, log-probs and values out; weights loaded by version.

For MLP policies the forward pass runs in numpy: an actor's batch is only E rows, where torch's per-op
dispatch (several microseconds per op) costs more than the math, and an actor that only ever receives
weights never imports torch (about 180 MB and a second or more of start-up per actor). It runs in
float64 and returns float32, so a row's result does not depend on the batch it came in (BLAS sums in a
different order for one row than for many; a truncated episode's V(final obs) must equal V of the same
obs elsewhere). Image policies (the CNN) use torch. Both paths compute the same function; tests compare
them.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from dppo.config import ModelConfig

if TYPE_CHECKING:
    import torch

    from dppo.rl.model import ActorCritic

Weights = dict[str, np.ndarray]
Layers = list[tuple[np.ndarray, np.ndarray]]
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LINEAR_KEY = re.compile(r"^(policy_head|value_head)\.(\d+)\.(weight|bias)$")


def export_weights(model: torch.nn.Module) -> Weights:
    """State dict as numpy arrays: zero-copy through Ray's object store."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def is_image(space: gym.Space) -> bool:
    """(H, W, C) or (C, H, W) uint8 boxes get the CNN; everything else the MLPs."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


def numpy_layers(weights: Weights) -> tuple[Layers, Layers]:
    """(W^T, b) per Linear of the policy and the value MLP, in order, as float64 copies."""
    found: dict[str, dict[int, dict[str, np.ndarray]]] = {"policy_head": {}, "value_head": {}}
    for key, value in weights.items():
        match = _LINEAR_KEY.match(key)
        if match:
            head, index, kind = match.groups()
            found[head].setdefault(int(index), {})[kind] = np.asarray(value, np.float64)
    policy, value = ([(layer["weight"].T, layer["bias"]) for _, layer in sorted(found[head].items())]
                     for head in ("policy_head", "value_head"))  # .T is a view: BLAS reads it transposed
    return policy, value


class Agent:
    """Acts with the current policy in batches over E envs; no gradients, one version at a time.

    ``seed`` seeds the action sampling; without it the seed is drawn from torch's generator (so an
    actor seeded with ``torch.manual_seed`` stays reproducible, at the cost of importing torch).
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig,
                 seed: int | None = None) -> None:
        self.obs_space, self.action_space, self.config = obs_space, action_space, config
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_shape: tuple[int, ...] = () if self.discrete else tuple(action_space.shape)
        self.fast = not is_image(obs_space)
        self.relu = config.activation == "relu"
        self.version = -1
        self._model: ActorCritic | None = None
        self._weights: Weights | None = None
        if seed is None:
            import torch

            seed = int(torch.randint(0, 2**62, ()).item())
        self.rng = np.random.default_rng(seed)
        if not self.fast:
            self._copy_weights(self.model)  # the torch path: build the CNN now

    @property
    def model(self) -> ActorCritic:
        """The torch model, built on first use (the numpy path never needs it) with the current weights."""
        if self._model is None:
            import torch

            from dppo.rl.model import ActorCritic

            model = ActorCritic(self.obs_space, self.action_space, self.config)
            if self._weights is not None:
                model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in self._weights.items()})
            model.eval()
            self._model = model
            if self._weights is None:
                self._copy_weights(model)
        return self._model

    def load(self, weights: Weights, version: int) -> None:
        """Load weights unless this version is already loaded."""
        if version == self.version:
            return
        if self._model is not None:
            import torch

            self._model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()})
        self._set_weights(weights)
        self.version = version

    def _copy_weights(self, model: torch.nn.Module) -> None:
        self._set_weights(export_weights(model))

    def _set_weights(self, weights: Weights) -> None:
        self._weights = weights
        if self.fast:
            self.policy_layers, self.value_layers = numpy_layers(weights)
            if not self.discrete:
                self.log_std = np.asarray(weights["log_std"], np.float64)

    def _ready(self) -> None:
        if self._weights is None:  # acting before any weights arrived: the model's initial ones
            _ = self.model

    def _mlp(self, layers: Layers, obs: np.ndarray) -> np.ndarray:
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
        self._ready()
        out = self._mlp(self.policy_layers, obs)
        value = self._mlp(self.value_layers, obs)[:, 0].astype(np.float32)
        if self.discrete:
            logits = out - out.max(axis=1, keepdims=True)
            log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
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
        return action.reshape(len(out), *self.action_shape), log_prob, value

    def _act_torch(self, obs: np.ndarray, greedy: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        import torch

        with torch.inference_mode():
            dist, value = self.model(torch.as_tensor(obs))
            if greedy:
                action = dist.probs.argmax(-1) if self.discrete else dist.mean
            else:
                action = dist.sample()
            log_prob = self.model.log_prob(dist, action)
        return action.numpy(), log_prob.numpy(), value.numpy()

    def value(self, obs: np.ndarray) -> np.ndarray:
        if self.fast:
            self._ready()
            return self._mlp(self.value_layers, obs)[:, 0].astype(np.float32)
        import torch

        with torch.inference_mode():
            return self.model.value(torch.as_tensor(obs)).numpy()
