"""Agent: the numpy fast path computes what the torch model computes, and samples from the same law."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from dppo.config import ModelConfig
from dppo.rl.agent import Agent, export_weights


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_numpy_path_matches_torch(env_id: str, activation: str) -> None:
    torch.manual_seed(0)
    env = gym.make(env_id)
    agent = Agent(env.observation_space, env.action_space, ModelConfig(activation=activation, init_log_std=0.3))
    assert agent.fast
    obs = np.random.default_rng(0).normal(size=(16, *env.observation_space.shape)).astype(np.float32)
    actions, log_probs, values = agent.act(obs)
    with torch.no_grad():
        dist, torch_values = agent.model(torch.as_tensor(obs))
        torch_log_probs = agent.model.log_prob(dist, torch.as_tensor(actions))
        greedy_torch = dist.mode()
    assert log_probs.dtype == values.dtype == np.float32
    assert actions.dtype == (np.int64 if agent.model.discrete else np.float32)
    assert actions.shape == (16, *env.action_space.shape)
    np.testing.assert_allclose(log_probs, torch_log_probs.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values, torch_values.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(agent.value(obs), torch_values.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(agent.act(obs, greedy=True)[0], greedy_torch.numpy(), rtol=1e-5, atol=1e-5)


def test_a_row_does_not_depend_on_its_batch() -> None:
    """V(final obs) of a truncated episode is computed in a batch of its own: it must be bit-identical."""
    torch.manual_seed(3)
    env = gym.make("CartPole-v1")
    agent = Agent(env.observation_space, env.action_space, ModelConfig())
    obs = np.random.default_rng(3).normal(size=(8, 4)).astype(np.float32)
    batch = agent.value(obs)
    for i in range(8):
        assert agent.value(obs[i:i + 1])[0] == batch[i]
        assert agent.value(obs[:i + 1])[i] == batch[i]


def test_loaded_weights_reach_the_numpy_path() -> None:
    env = gym.make("CartPole-v1")
    source = Agent(env.observation_space, env.action_space, ModelConfig())
    target = Agent(env.observation_space, env.action_space, ModelConfig())
    obs = np.ones((2, 4), np.float32)
    assert not np.allclose(source.value(obs), target.value(obs))
    target.load(export_weights(source.model), version=3)
    np.testing.assert_allclose(source.value(obs), target.value(obs), rtol=1e-6)
    assert target.version == 3


def test_categorical_sampling_follows_the_probabilities() -> None:
    torch.manual_seed(1)
    env = gym.make("CartPole-v1")
    agent = Agent(env.observation_space, env.action_space, ModelConfig())
    with torch.no_grad():
        agent.model.policy_head[-1].bias.copy_(torch.tensor([0.0, 1.0]))  # p(1) = sigmoid(1) ~ 0.73
    agent.load(export_weights(agent.model), version=1)
    obs = np.zeros((20_000, 4), np.float32)
    actions, log_probs, _ = agent.act(obs)
    p1 = 1 / (1 + np.exp(-1.0))
    assert abs(actions.mean() - p1) < 0.015  # 5 standard errors
    np.testing.assert_allclose(log_probs[actions == 1], np.log(p1), rtol=1e-5)


def test_seeded_torch_makes_sampling_reproducible() -> None:
    env = gym.make("CartPole-v1")
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        agent = Agent(env.observation_space, env.action_space, ModelConfig())
        runs.append(agent.act(np.zeros((64, 4), np.float32))[0])
    np.testing.assert_array_equal(*runs)
