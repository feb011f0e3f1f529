"""Action masking: masked actions get probability 0 in the actors' numpy path and in the torch model alike
(property tests over Discrete and MultiDiscrete), the mask stays out of the network unless asked, and every
wrong mask configuration is one clear error."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dppo.config import ModelConfig
from dppo.errors import UnsupportedSpace
from dppo.rl.actions import NoLegalAction
from dppo.rl.agent import Agent
from dppo.rl.spaces import check_first_observation, check_spaces

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def masked_env_spaces(nvec: list[int]) -> tuple[gym.Space, gym.Space]:
    actions = gym.spaces.Discrete(nvec[0]) if len(nvec) == 1 else gym.spaces.MultiDiscrete(nvec)
    obs = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
                           "action_mask": gym.spaces.MultiBinary(sum(nvec))})
    return obs, actions


def random_masks(rng: np.random.Generator, rows: int, nvec: list[int]) -> np.ndarray:
    """0/1 masks with at least one legal value in every component of every row."""
    parts = []
    for n in nvec:
        part = rng.integers(0, 2, (rows, n))
        part[np.arange(rows), rng.integers(0, n, rows)] = 1
        parts.append(part)
    return np.concatenate(parts, axis=1).astype(np.int8)


@SETTINGS
@given(nvec=st.lists(st.integers(2, 5), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_numpy_and_torch_agree_and_masked_actions_are_never_taken(nvec: list[int], seed: int) -> None:
    torch.manual_seed(seed)
    obs_space, action_space = masked_env_spaces(nvec)
    agent = Agent(obs_space, action_space, ModelConfig(), seed=seed)
    assert agent.fast and agent.obs_spec.has_mask and agent.obs_spec.vector_dim == 3  # the mask is not input
    rng = np.random.default_rng(seed)
    rows = 64
    masks = random_masks(rng, rows, nvec)
    encoded = agent.obs_spec.encode({"pos": rng.normal(size=(rows, 3)).astype(np.float32), "action_mask": masks})
    actions, log_probs, _ = agent.act(encoded)
    greedy, _, _ = agent.act(encoded, greedy=True)
    flat_actions, flat_greedy = actions.reshape(rows, -1), greedy.reshape(rows, -1)
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    assert masks[np.arange(rows)[:, None], offsets + flat_actions].all()  # only legal actions sampled
    assert masks[np.arange(rows)[:, None], offsets + flat_greedy].all()  # and the mode is legal
    with torch.no_grad():
        dist, _ = agent.model(encoded.map(torch.as_tensor))
        torch_log_probs = dist.log_prob(torch.as_tensor(actions))
        entropy = dist.entropy()
        # numpy's mode (float64) is torch's (float32) up to their precision: a near-tie may pick either action
        torch.testing.assert_close(dist.log_prob(torch.as_tensor(greedy)), dist.log_prob(dist.mode()), rtol=0,
                                   atol=1e-5)
    np.testing.assert_allclose(log_probs, torch_log_probs.numpy(), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(entropy).all()


def test_a_row_with_a_single_legal_action_has_zero_entropy_and_log_prob() -> None:
    obs_space, action_space = masked_env_spaces([4])
    agent = Agent(obs_space, action_space, ModelConfig(), seed=0)
    mask = np.array([[0, 0, 1, 0]], np.int8)
    encoded = agent.obs_spec.encode({"pos": np.zeros((1, 3), np.float32), "action_mask": mask})
    actions, log_probs, _ = agent.act(encoded)
    assert actions.tolist() == [2] and abs(float(log_probs[0])) < 1e-6
    with torch.no_grad():
        dist, _ = agent.model(encoded.map(torch.as_tensor))
        assert abs(float(dist.entropy()[0])) < 1e-6


def test_a_mask_that_allows_nothing_is_named() -> None:
    obs_space, action_space = masked_env_spaces([3, 2])
    agent = Agent(obs_space, action_space, ModelConfig(), seed=0)
    mask = np.array([[1, 0, 0, 0, 0]], np.int8)  # component 1 has no legal value
    encoded = agent.obs_spec.encode({"pos": np.zeros((1, 3), np.float32), "action_mask": mask})
    with pytest.raises(NoLegalAction, match="row 0 of the mask allows no action component 1"):
        agent.act(encoded)
    with pytest.raises(UnsupportedSpace, match=r"env 'x': the action mask of reset\(\)'s observation"):
        check_first_observation(agent.obs_spec, agent.action_spec,
                                {"pos": np.zeros(3, np.float32), "action_mask": np.zeros(5, np.int8)}, "x")


def test_the_mask_can_be_network_input_too_and_is_off_with_a_null_key() -> None:
    obs_space, action_space = masked_env_spaces([4])
    inside, _ = check_spaces(obs_space, action_space, ModelConfig(mask_in_network=True))
    assert inside.has_mask and inside.vector_dim == 3 + 4
    off, _ = check_spaces(obs_space, action_space, ModelConfig(action_mask_key=None))
    assert not off.has_mask and off.vector_dim == 3 + 4  # then it is a plain MultiBinary leaf


@pytest.mark.parametrize(("obs_space", "action_space", "model", "message"), [
    (gym.spaces.Dict({"pos": gym.spaces.Discrete(3)}), gym.spaces.Discrete(3), ModelConfig(action_mask_key="legal"),
     "model.action_mask_key='legal' is not a key of the observation ['pos']"),
    (gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(3)}), gym.spaces.Discrete(4), ModelConfig(),
     "obs['action_mask'] holds 3 values, but Discrete(4) needs one per action (4"),
    (gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(2)}), gym.spaces.Box(-1, 1, (2,)), ModelConfig(),
     "masks apply to Discrete and MultiDiscrete actions"),
])
def test_wrong_mask_configurations_are_one_clear_error(obs_space: gym.Space, action_space: gym.Space,
                                                       model: ModelConfig, message: str) -> None:
    with pytest.raises(UnsupportedSpace) as err:
        check_spaces(obs_space, action_space, model)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_without_the_default_key_nothing_is_masked() -> None:
    spec, _ = check_spaces(gym.spaces.Dict({"pos": gym.spaces.Discrete(3)}), gym.spaces.Discrete(2), ModelConfig())
    assert not spec.has_mask and spec.empty((2,)).mask is None
