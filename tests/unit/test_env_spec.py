"""The env's kind, decided once (dppo.envs.make.env_spec): the driver resolves it with the config into the spec its
actors get, and making envs dispatches on it without telling the kind again."""

from __future__ import annotations

import gymnasium as gym
import pytest

from dppo.config import load_config
from dppo.envs import make
from dppo.envs.columns import PolicyView
from dppo.envs.make import EnvSpec, env_spec, make_env, make_vector_env, with_agents
from dppo.envs.multiagent import AgentTurns
from dppo.envs.selfplay import SelfPlayEnv, SelfPlayVectorEnv
from dppo.errors import UsageError

# kind -> (overrides, agents per copy, the vector env and the one env that kind is made as)
KINDS = {
    "gymnasium": ({"env.id": "CartPole-v1"}, 1, gym.vector.SyncVectorEnv, gym.Env),
    "ale": ({"env.id": "ALE/Breakout-v5", "env.atari": True, "env.vectorization": "ale"}, 1, gym.vector.VectorEnv,
            gym.Env),
    "parallel": ({"env.entry_point": "dppo.envs.flaky:flaky_pair", "env.multiagent": True}, 2, PolicyView,
                 AgentTurns),
    "turn_based": ({"env.entry_point": "dppo.envs.flaky:flaky_tictactoe", "env.multiagent": True}, 1,
                   SelfPlayVectorEnv, SelfPlayEnv),
}


@pytest.mark.parametrize("kind", KINDS)
def test_the_kind_is_resolved_once_into_the_spec_and_every_maker_reads_it(kind: str, monkeypatch) -> None:
    overrides, agents, vector_type, env_type = KINDS[kind]
    config = with_agents(load_config(overrides={**overrides, "env.num_envs": 2, "ppo.num_minibatches": 1}))
    spec = env_spec(config)
    assert isinstance(spec, EnvSpec) and spec.kind == config.env.kind == kind
    assert list(spec.spaces) == config.policy_names and spec.columns == 2 * agents == config.columns
    (obs_space, action_space), = spec.spaces.values()

    def told_again(env: object) -> str:
        raise AssertionError("the kind is told again from an env")

    monkeypatch.setattr(make, "_pettingzoo_kind", told_again)  # resolved: no maker looks at an env to tell it
    vector = make_vector_env(config)
    one = make_env(config.env)
    try:
        assert isinstance(vector, vector_type) and isinstance(one, env_type)
        assert vector.single_observation_space == obs_space and vector.single_action_space == action_space
    finally:
        vector.close()
        one.close()


def test_a_turn_based_game_with_a_policy_map_is_refused_when_its_kind_is_resolved() -> None:
    config = load_config(overrides={**KINDS["turn_based"][0], "ppo.num_minibatches": 1},
                         sets=["policies.first=[player_1]", "policies.second=[player_2]"])
    with pytest.raises(UsageError, match="turn-based game, trained by self-play with one policy"):
        with_agents(config)
