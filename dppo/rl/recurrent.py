"""Recurrent policies (``model.recurrent: lstm``): an LSTM between the encoder and the policy and value heads.

Actors step it one observation at a time and carry its memory across steps and segments; the update replays
each env's column of T steps in order, from the memory that column's segment started with (CleanRL's
``ppo_atari_lstm.py``), so the log-probs it recomputes before the first gradient step are the actors' own.
The memory is zeroed before an observation that starts an episode: ``starts[t]`` marks those, in the actors
and in the replay alike.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from dppo.config import ModelConfig
from dppo.rl.model import ActionDist, ActorCritic
from dppo.rl.spaces import Obs

Memory = tuple[torch.Tensor, torch.Tensor]  # the LSTM's (h, c), each (1, rows, hidden)


class RecurrentActorCritic(ActorCritic):
    """Encoder features -> LSTM -> the feed-forward model's policy and value heads."""

    recurrent = True

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig) -> None:
        super().__init__(obs_space, action_space, config, head_inputs=config.lstm_hidden_size)
        self.hidden_size = config.lstm_hidden_size
        self.lstm = nn.LSTM(self.feature_dim, self.hidden_size)
        for name, param in self.lstm.named_parameters():  # CleanRL's initialization
            if "bias" in name:
                nn.init.constant_(param, 0.0)
            else:
                nn.init.orthogonal_(param, 1.0)

    def initial_memory(self, rows: int) -> Memory:
        zeros = torch.zeros(1, rows, self.hidden_size)
        return zeros, zeros.clone()

    def unroll(self, features: torch.Tensor, starts: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, Memory]:
        """The LSTM over (T, B, F) features, step by step, zeroing the memory of rows where ``starts[t]``."""
        h, c = memory
        outputs = []
        for t in range(features.shape[0]):
            keep = (~starts[t]).to(features.dtype).view(1, -1, 1)
            out, (h, c) = self.lstm(features[t:t + 1], (h * keep, c * keep))
            outputs.append(out[0])
        return torch.stack(outputs), (h, c)

    def step(self, obs: Obs, memory: Memory, starts: torch.Tensor) -> tuple[ActionDist, torch.Tensor, Memory]:
        """One step of B envs: the action distribution, V and the memory after this observation."""
        core, memory = self.unroll(self.features(obs)[None], starts[None], memory)
        return self.distribution(core[0], obs.mask), self.value_head(core[0]).squeeze(-1), memory

    def evaluate_columns(self, obs: Obs, actions: torch.Tensor, starts: torch.Tensor, memory: Memory,
                         steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi(a|s), entropy and V(s) for C env columns of ``steps`` steps, rows column-major (c * T + t)."""
        columns = len(starts) // steps
        features = self.features(obs).reshape(columns, steps, -1).transpose(0, 1)
        core, _ = self.unroll(features, starts.reshape(columns, steps).T, memory)
        core = core.transpose(0, 1).reshape(columns * steps, -1)
        dist = self.distribution(core, obs.mask)
        return dist.log_prob(actions), dist.entropy(), self.value_head(core).squeeze(-1)

    def forward(self, obs: Obs | torch.Tensor) -> tuple[ActionDist, torch.Tensor]:
        """Each row as the first step of an episode (a recurrent policy needs its memory: see :meth:`step`)."""
        obs = self.as_obs(obs)
        rows = len(obs)
        dist, value, _ = self.step(obs, self.initial_memory(rows), torch.ones(rows, dtype=torch.bool))
        return dist, value

