"""Every env kind in every placement of the policy, with an env that raises now and then (issue 54's matrix, in
process: the Sampler is plain Python). Kinds: a gymnasium env, ale-py's vector env (it cannot recreate one copy, so
it raises out of ``step``), a two-agent PettingZoo Parallel env, tic-tac-toe by self-play. Placements: the policy in
the actor, on a worker thread in two halves, in the inference service through shared memory. Each row samples
segments of full length, counts its failures, leaves no request in flight and nothing in /dev/shm. Rows that cannot
exist are refused with one line. The same faults on a real cluster: tests/integration/test_env_failures.py."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import VectorWrapper
from test_shm_transport import running_service

from dppo.config import Config, ConfigError, load_config
from dppo.distributed.actor import actor_sampler
from dppo.envs.checks import check_env
from dppo.envs.flaky import FlakyPair
from dppo.envs.make import env_spec, make_vector_env, with_agents
from dppo.envs.user_code import EnvLoadError
from dppo.errors import OneLineWarning
from dppo.rl.agent import export_weights
from dppo.rl.build import build_model
from dppo.rl.opponents import SelfPlayGames
from dppo.rl.sampler import Sampler
from dppo.transport.client import ShmClient
from dppo.transport.protocol import SHM_DIR, Layout

STEPS = 32
KINDS = {
    "gymnasium": {"env.entry_point": "dppo.envs.flaky:flaky_gym", "env.kwargs": {"every": 40, "anywhere": True}},
    "ale": {"env.id": "ALE/Breakout-v5", "env.atari": True, "env.vectorization": "ale"},
    "parallel": {"env.entry_point": "dppo.envs.flaky:flaky_pair", "env.multiagent": True,
                 "env.kwargs": {"every": 40, "anywhere": True}},
    "turn_based": {"env.entry_point": "dppo.envs.flaky:flaky_tictactoe", "env.multiagent": True,
                   "env.kwargs": {"every": 40, "anywhere": True}},
}
PLACEMENTS = {"actor": {}, "halves": {"run.actor_halves": 2}, "service": {"run.inference": "server"}}


class RaiseEvery(VectorWrapper):
    """ale-py's vector env with a step that raises out of it now and then (a fault it cannot isolate to a copy)."""

    def __init__(self, env: gym.vector.VectorEnv, every: int) -> None:
        super().__init__(env)
        self.every, self.steps = every, 0

    def step(self, actions: Any) -> Any:
        self.steps += 1
        if self.steps % self.every == 0:
            raise RuntimeError("the emulator lost its state")
        return self.env.step(actions)


def row_config(kind: str, placement: str) -> Config:
    overrides = {**KINDS[kind], **PLACEMENTS[placement], "env.num_envs": 2, "ppo.segment_length": STEPS,
                 "ppo.num_minibatches": 1, "faults.env_retries": 3, "run.seed": 5}
    if kind == "turn_based":
        overrides["model.hidden_sizes"] = [32]
    return with_agents(load_config(overrides=overrides))


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def row_sampler(config: Config, stack: ExitStack) -> Sampler:
    """The actor's sampler for ``config``, its policy's weights loaded (the service's, for a served policy)."""
    spec = env_spec(config)
    (obs_space, action_space), = spec.spaces.values()
    torch.manual_seed(0)
    weights = export_weights(build_model(obs_space, action_space, config.model))
    games = SelfPlayGames(config, seed=11)
    make_envs = games.make_envs
    if config.env.vectorization == "ale":
        make_envs = lambda cfg: RaiseEvery(make_vector_env(cfg), every=50)  # noqa: E731
    sampler = actor_sampler(config, 0, 11, spec, make_envs)
    stack.callback(sampler.close)
    if config.run.inference == "server":
        _, endpoint, _ = stack.enter_context(running_service(obs_space, action_space, config.model, {0: weights}))
        policy = sampler.policy
        policy.backend = ShmClient(endpoint, Layout(policy.obs_spec, policy.action_spec, config.model, config.columns))
        stack.callback(policy.backend.close)
        sampler.set_weights({}, 0)
    else:
        sampler.set_weights(weights, 0)
    return sampler


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_trains_through_its_env_faults_in_every_placement(kind: str, placement: str,
                                                                      stack: ExitStack) -> None:
    config = row_config(kind, placement)
    sampler = row_sampler(config, stack)
    assert len(sampler.half_envs) == (2 if placement != "actor" else 1)
    failures = 0
    for _ in range(3):
        segment = sampler.sample()
        assert segment.rewards.shape == (STEPS, config.columns)
        failures += segment.env_failures.count
        cut = segment.truncated & ~segment.terminated
        assert (segment.final_values[cut] != 0).any() or not cut.any()  # a cut episode is bootstrapped
    assert failures >= 1 and not sampler.in_flight
    backend = getattr(sampler.policy, "backend", None)
    if isinstance(backend, ShmClient):
        assert not backend.asked and len(backend.free) == backend.layout.regions  # every region back
        token = backend.endpoint.token
        stack.close()
        assert not list(SHM_DIR.glob(f"dppo_*_{token}_*"))  # the service's segments are gone with it


@pytest.mark.parametrize(("overrides", "message"), [
    ({"run.actor_halves": 2}, r"^run\.actor_halves=2 and run\.actor_gpus run one policy in each actor, and "
                              r"policies names 2; drop them or map every agent to one policy$"),
    ({"run.inference": "server"}, r"^run\.inference=server serves one policy, and policies names 2; set "
                                  r"run\.inference=actor$"),
])
def test_a_policy_map_with_halves_or_the_service_is_refused_with_one_line(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides={**KINDS["parallel"], **overrides, "env.num_envs": 2,
                               "policies": {"speak": ["speaker"], "listen": ["listener"]}})


def test_one_copy_of_a_two_agent_env_is_served_in_one_group(stack: ExitStack) -> None:
    """Issue 54 item 2: with one env copy of two agents the service's policy takes one group (the copies decide,
    not the agent columns), and samples."""
    config = with_agents(load_config(overrides={**KINDS["parallel"], "run.inference": "server", "env.num_envs": 1,
                                                "ppo.segment_length": STEPS, "ppo.num_minibatches": 1}))
    sampler = row_sampler(config, stack)
    assert len(sampler.half_envs) == 1 and sampler.sample().rewards.shape == (STEPS, 2)


def test_flaky_envs_raise_only_in_actors_unless_told() -> None:
    from dppo.envs.flaky import FlakyEnv

    quiet = FlakyEnv(gym.make("CartPole-v1"), every=1)
    quiet.reset(seed=0)
    assert quiet.step(0)[0].shape == (4,)  # not in a Ray actor: never raises, though every step would
    loud = FlakyEnv(gym.make("CartPole-v1"), every=1, anywhere=True)
    loud.reset(seed=0)
    with pytest.raises(ValueError, match="lost its state"):
        loud.step(0)


class KeepsTheListener(FlakyPair):
    """The listener terminates at step 3 and stays in ``agents`` (PettingZoo's own parallel_api_test fails it)."""

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terminated, truncated, infos = super().step(actions)
        if self.t == 3:
            terminated["listener"] = True
        return obs, rewards, terminated, truncated, infos


class Stranger(FlakyPair):
    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        result = super().step(actions)
        self.agents = [*self.agents, "stranger"] if self.agents else []
        return result


class Mute(FlakyPair):
    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        obs, *rest = super().step(actions)
        del obs["listener"]
        return (obs, *rest)


def keeps_the_listener() -> KeepsTheListener:
    return KeepsTheListener(every=10**9)


def stranger() -> Stranger:
    return Stranger(every=10**9)


def mute() -> Mute:
    return Mute(every=10**9)


def test_an_env_that_bends_pettingzoos_api_is_warned_in_one_line_or_refused() -> None:
    def checked(factory: str) -> Config:
        return with_agents(load_config(overrides={"env.entry_point": f"test_fault_matrix:{factory}",
                                                  "env.multiagent": True, "ppo.num_minibatches": 1}))

    with pytest.warns(OneLineWarning, match=r"^env 'test_fault_matrix:keeps_the_listener' keeps agent 'listener' in "
                                            r"agents after it terminated or truncated"):
        check_env(checked("keeps_the_listener"))
    with pytest.raises(EnvLoadError, match=r"agent 'stranger' is in agents but not in possible_agents"):
        check_env(checked("stranger"))
    with pytest.raises(EnvLoadError, match=r"live agent 'listener' got no observation"):
        check_env(checked("mute"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(row_config("parallel", "actor"))  # a well-behaved env: not a word
