"""Model: action distributions per space, the CNN path, and the initialization scheme."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from dppo.config import ModelConfig
from dppo.rl.agent import Agent
from dppo.rl.encoders import NatureCNN
from dppo.rl.model import ActorCritic


def test_discrete_policy_is_categorical_and_near_uniform_at_init() -> None:
    model = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), ModelConfig())
    dist, value = model(torch.randn(5, 4))
    assert isinstance(dist.parts[0], torch.distributions.Categorical) and len(dist.parts) == 1
    assert value.shape == (5,)
    # policy head gain 0.01: logits start tiny, so the policy starts close to uniform
    assert torch.allclose(dist.parts[0].probs, torch.full((5, 3), 1 / 3), atol=0.02)


def test_continuous_policy_has_state_independent_log_std() -> None:
    model = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,)), ModelConfig(init_log_std=-0.5))
    dist, _ = model(torch.randn(7, 3))
    assert torch.allclose(dist.parts[0].stddev, torch.full((7, 2), float(np.exp(-0.5))))
    actions = torch.randn(7, 2)
    assert model.log_prob(dist, actions).shape == (7,)  # summed over action dimensions


def test_init_is_orthogonal_with_ppo_gains_and_zero_biases() -> None:
    model = ActorCritic(gym.spaces.Box(-1, 1, (8,)), gym.spaces.Discrete(2), ModelConfig(hidden_sizes=[64, 64]))
    hidden = model.policy_head[0].weight
    # orthogonal rows scaled by sqrt(2): W W^T = 2 I for a (64, 8) matrix's columns -> W^T W = 2 I
    assert torch.allclose(hidden.T @ hidden, 2 * torch.eye(8), atol=1e-4)
    assert model.policy_head[-1].weight.abs().max() < 0.05
    biases = [layer.bias.detach() for layer in model.modules() if isinstance(layer, torch.nn.Linear)]
    assert all(float(b.abs().max()) == 0.0 for b in biases)


def test_image_observations_use_the_cnn() -> None:
    obs_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    agent = Agent(obs_space, gym.spaces.Discrete(6), ModelConfig())
    assert isinstance(agent.model.encoder, NatureCNN)
    obs = np.random.default_rng(0).integers(0, 256, (3, 84, 84, 4), dtype=np.uint8)
    actions, log_probs, values = agent.act(obs)
    assert actions.shape == (3,) and log_probs.shape == (3,) and values.shape == (3,)
    greedy, _, _ = agent.act(obs, greedy=True)
    assert ((greedy >= 0) & (greedy < 6)).all()
