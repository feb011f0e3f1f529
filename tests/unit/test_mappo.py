"""MAPPO's centralized critic (env.global_state, model.value_only_key): the env's global state beside each agent's
observation, seen by the value network and never by the policy, in the torch and the numpy paths alike."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from dppo.config import ConfigError, load_config
from dppo.envs.make import make_env, make_vector_env
from dppo.errors import UsageError
from dppo.rl.agent import Agent, export_weights
from dppo.rl.build import build_model
from dppo.rl.spaces import UnsupportedSpace

warnings.filterwarnings("ignore", category=DeprecationWarning)
SPREAD = {"env.id": "mpe2.simple_spread_v3", "env.num_envs": 2}
SHORT = ["env.kwargs.max_cycles=5", "env.global_state=true"]


def test_each_agent_sees_its_copys_global_state() -> None:
    config = load_config(None, SPREAD, SHORT)
    assert config.model.value_only_key == "global_state"
    vec = make_vector_env(config)
    obs, _ = vec.reset(seed=0)
    states = [np.asarray(env.state()) for env in vec.envs]
    np.testing.assert_array_equal(obs["global_state"], np.repeat(states, 3, axis=0))  # 2 copies x 3 agents
    obs, *_ = vec.step(np.zeros(6, np.int64))
    np.testing.assert_array_equal(obs["global_state"][3], vec.envs[1].state())
    assert obs["observation"].shape == (6, 18) and obs["global_state"].shape == (6, 54)
    turns = make_env(config.env)
    first, _ = turns.reset(seed=0)
    np.testing.assert_array_equal(first["global_state"], turns.env.state())


def test_the_policy_never_sees_the_global_state_and_the_critic_does() -> None:
    config = load_config(None, SPREAD, SHORT)
    vec = make_vector_env(config)
    obs, _ = vec.reset(seed=0)
    model = build_model(vec.single_observation_space, vec.single_action_space, config.model)
    agent = Agent(vec.single_observation_space, vec.single_action_space, config.model, seed=0)
    agent.load(export_weights(model), 1)
    moved = {**obs, "global_state": obs["global_state"] + 5.0}
    before, after = agent.heads(agent.obs_spec.encode(obs)), agent.heads(agent.obs_spec.encode(moved))
    np.testing.assert_array_equal(before.out, after.out)
    assert not np.allclose(before.values, after.values)
    with torch.inference_mode():  # the numpy path (actors) computes what the torch model (learner) does
        dist, value = model(agent.obs_spec.encode(moved).map(torch.as_tensor))
    np.testing.assert_allclose(dist.parts[0].logits.numpy(), torch.log_softmax(torch.as_tensor(after.out), -1),
                               atol=1e-5)
    np.testing.assert_allclose(value.numpy(), after.values, atol=1e-5)
    assert model.policy_head[0].in_features == 18 and model.value_head[0].in_features == 72


class Stateless(gym.Env):
    observation_space = gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (2,)), "b": gym.spaces.Box(0, 1, (3,))})
    action_space = gym.spaces.Discrete(2)


def test_bad_critic_input_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"env\.global_state applies to multi-agent envs"):
        load_config(None, {}, ["env.global_state=true"])
    with pytest.raises(ConfigError, match="works with feed-forward models"):
        load_config(None, SPREAD, [*SHORT, "model.recurrent=lstm"])
    model = load_config(None, {}, ["model.value_only_key=c"]).model
    with pytest.raises(UnsupportedSpace, match=r"value_only_key='c' is not a key of the observation \['a', 'b'\]"):
        build_model(Stateless.observation_space, Stateless.action_space, model)
    no_state = load_config(None, {"env.entry_point": "test_multiagent:relay_env", "env.num_envs": 2},
                           ["env.multiagent=true", "env.global_state=true"])
    with pytest.raises(UsageError, match="has no state\\(\\) and state_space"):
        make_vector_env(no_state)
