"""Agent: numpy observations in, actions, log-probs and values out; weights loaded by version."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from dppo.config import ModelConfig
from dppo.model import ActorCritic

Weights = dict[str, np.ndarray]


def export_weights(model: torch.nn.Module) -> Weights:
    """State dict as numpy arrays: zero-copy through Ray's object store."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


class Agent:
    """Acts with the current policy in batches over E envs; no gradients, one version at a time."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig) -> None:
        self.model = ActorCritic(obs_space, action_space, config)
        self.model.eval()
        self.version = -1
        self.obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 else torch.float32

    def load(self, weights: Weights, version: int) -> None:
        """Load weights unless this version is already loaded."""
        if version == self.version:
            return
        self.model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()})
        self.version = version

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, dtype=self.obs_dtype)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, greedy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample (or pick the mode of) actions for a batch: (actions, log_probs, values)."""
        dist, value = self.model(self._tensor(obs))
        if greedy:
            action = dist.probs.argmax(-1) if self.model.discrete else dist.mean
        else:
            action = dist.sample()
        log_prob = self.model.log_prob(dist, action)
        return action.numpy(), log_prob.numpy(), value.numpy()

    @torch.inference_mode()
    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.model.value(self._tensor(obs)).numpy()
