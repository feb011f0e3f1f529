"""PettingZoo Parallel envs as dppo steps them (dppo.envs.multiagent): agents as columns, SAME_STEP autoreset with
the final observation, per-agent rewards and done flags, agents leaving early (black death), action masks per
agent, agent ids, the one-env view that eval plays, and naming PettingZoo envs in the config."""

from __future__ import annotations

import dataclasses
import sys
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch
from pettingzoo import ParallelEnv

from dppo.config import ConfigError, load_config
from dppo.envs.checks import check_env
from dppo.envs.columns import ParallelVectorEnv
from dppo.envs.make import make_env, make_pettingzoo_env, make_vector_env, with_agents
from dppo.envs.multiagent import AgentTurns
from dppo.envs.user_code import EnvLoadError
from dppo.errors import UsageError
from dppo.rl.agent import export_weights
from dppo.rl.batch import build_batch
from dppo.rl.sampler import Sampler

MASKS = {"runner": np.array([1, 1, 0], np.int8), "scout": np.array([0, 1, 1], np.int8)}


class Relay(ParallelEnv):
    """Two agents. The scout earns 10 a step and leaves (terminated) after ``scout_steps`` steps; the runner earns
    1 a step and is cut by the time limit (truncated) after ``steps``. The observation says whose it is, the step
    and a random start, so columns can be told apart; each agent has its own action mask."""

    metadata: ClassVar[dict] = {"name": "relay_v0", "render_fps": 5}

    def __init__(self, steps: int = 4, scout_steps: int = 2, render_mode: str | None = None,
                 scout_cut: bool = False) -> None:
        self.possible_agents = ["runner", "scout"]
        self.steps, self.scout_steps, self.render_mode = steps, scout_steps, render_mode
        self.scout_cut = scout_cut  # the scout leaves by its own time limit (truncated), not terminated
        self.rng = np.random.default_rng()
        self.actions_seen: list[dict] = []

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Dict({"state": gym.spaces.Box(-100, 100, (3,), np.float32),
                                "action_mask": gym.spaces.MultiBinary(3)})

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(3)

    def _obs(self, agent: str) -> dict:
        who = self.possible_agents.index(agent)
        return {"state": np.array([who + 1, self.t, self.start], np.float32), "action_mask": MASKS[agent].copy()}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t, self.start = list(self.possible_agents), 0, float(self.rng.integers(0, 50))
        return {a: self._obs(a) for a in self.agents}, {a: {"start": self.start} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.actions_seen.append(dict(actions))
        self.t += 1
        rewards = {a: 10.0 if a == "scout" else 1.0 for a in self.agents}
        scout_leaves = {a: a == "scout" and self.t >= self.scout_steps for a in self.agents}
        term = {a: scout_leaves[a] and not self.scout_cut for a in self.agents}
        trunc = {a: self.t >= self.steps or (scout_leaves[a] and self.scout_cut) for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        infos = {a: {"t": self.t} for a in self.agents}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rewards, term, trunc, infos


class Odd(Relay):
    """The scout sees more than the runner: one shared policy cannot serve both."""

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(-1, 1, (2 if agent == "scout" else 3,), np.float32)


class OneAgent(ParallelEnv):
    """A gymnasium env as a Parallel env of one agent: dppo must step it exactly as it steps the gymnasium env."""

    metadata: ClassVar[dict] = {"name": "one_agent_v0"}

    def __init__(self, env_id: str, max_episode_steps: int) -> None:
        self.env = gym.make(env_id, max_episode_steps=max_episode_steps)
        self.possible_agents = ["agent"]

    def observation_space(self, agent: str) -> gym.Space:
        return self.env.observation_space

    def action_space(self, agent: str) -> gym.Space:
        return self.env.action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents = ["agent"]
        obs, info = self.env.reset(seed=seed, options=options)
        return {"agent": obs}, {"agent": info}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        obs, reward, terminated, truncated, info = self.env.step(actions["agent"])
        if terminated or truncated:
            self.agents = []
        return {"agent": obs}, {"agent": reward}, {"agent": terminated}, {"agent": truncated}, {"agent": info}


def one_agent_env(**kwargs) -> OneAgent:
    return OneAgent(**kwargs)


def relay_env(**kwargs) -> Relay:
    return Relay(**kwargs)


def odd_env() -> Odd:
    return Odd()


def a_gymnasium_env() -> gym.Env:
    return gym.make("CartPole-v1")


def config(*sets: str, num_envs: int = 2):
    return load_config(None, {"env.entry_point": "test_multiagent:relay_env", "env.num_envs": num_envs},
                       ["env.multiagent=true", "ppo.segment_length=8", "ppo.minibatch_size=16", *sets])


def step(vec: ParallelVectorEnv, action: int = 1):
    return vec.step(np.full(vec.num_envs, action))


def test_each_agent_of_each_copy_is_a_column_with_its_own_reward_and_mask() -> None:
    vec = ParallelVectorEnv([Relay(), Relay()], "relay")
    obs, info = vec.reset(seed=3)
    assert vec.num_envs == 4 and vec.single_action_space == gym.spaces.Discrete(3)
    assert obs["state"].shape == (4, 3) and obs["state"][:, 0].tolist() == [1, 2, 1, 2]  # runner, scout, runner, ..
    assert obs["action_mask"].tolist() == [[1, 1, 0], [0, 1, 1]] * 2
    starts = [float(np.random.default_rng(seed).integers(0, 50)) for seed in (3, 4)]  # copies seeded 3 and 4
    assert obs["state"][:, 2].tolist() == [starts[0]] * 2 + [starts[1]] * 2 and starts[0] != starts[1]
    assert info["start"].tolist() == [obs["state"][c, 2] for c in range(4)]
    _, reward, terminated, truncated, info = step(vec)
    assert reward.tolist() == [1.0, 10.0, 1.0, 10.0]
    assert not terminated.any() and not truncated.any() and info["t"].tolist() == [1, 1, 1, 1]


def test_an_agent_that_leaves_is_padded_until_the_copy_ends_then_ends_with_its_own_cause() -> None:
    env = Relay(steps=4, scout_steps=2)
    vec = ParallelVectorEnv([env], "relay", mask_key="action_mask")
    assert vec.reset(seed=0)[1]["active"].tolist() == [True, True]
    step(vec)
    obs, reward, terminated, truncated, info = step(vec)  # the scout leaves: its reward counts, its episode goes on
    assert reward.tolist() == [1.0, 10.0] and not terminated.any() and not truncated.any()
    assert info["active"].tolist() == [True, False]  # from here the scout's column is padding
    assert obs["state"][1].tolist() == [0, 0, 0] and obs["action_mask"][1].tolist() == [1, 1, 1]  # black death
    assert obs["state"][0, 1] == 2  # the runner plays on
    obs, reward, terminated, truncated, info = step(vec)
    assert reward.tolist() == [1.0, 0.0] and "scout" not in env.actions_seen[-1]  # its actions are dropped
    start = obs["state"][0, 2]
    obs, reward, terminated, truncated, info = step(vec)  # the runner's time is up: the copy's episode ends
    assert terminated.tolist() == [False, True] and truncated.tolist() == [True, False]
    assert info["_final_obs"].tolist() == [True, True]
    assert info["final_obs"][0]["state"].tolist() == [1, 4, start]  # the runner's real last observation
    assert info["final_obs"][1]["state"].tolist() == [0, 0, 0]  # the scout's padding
    assert info["final_info"]["t"].tolist() == [4, 0] and info["final_info"]["_t"].tolist() == [True, False]
    assert obs["state"][:, 1].tolist() == [0, 0] and obs["state"][:, 0].tolist() == [1, 2]  # the next episode
    assert info["active"].tolist() == [True, True]
    assert "start" in info  # the reset's info, as gymnasium's vector envs give it


def cut_relay_env(**kwargs) -> Relay:
    return Relay(scout_cut=True, **kwargs)


def test_an_agent_cut_by_its_own_time_limit_is_bootstrapped_while_its_copy_goes_on() -> None:
    """The scout's own time limit (truncated at step 2 of 4) is a cut, not a death: the view hands its last real
    observation to the sampler, which bootstraps its last live step from V(final obs); its episode still ends with
    the copy's, its return and length as before."""
    env = Relay(steps=4, scout_steps=2, scout_cut=True)
    vec = ParallelVectorEnv([env], "relay")
    start = vec.reset(seed=0)[0]["state"][1, 2]
    step(vec)
    _, _, terminated, truncated, info = step(vec)
    assert not terminated.any() and not truncated.any() and info["active"].tolist() == [True, False]
    assert info["agent_truncated"].tolist() == [False, True] and info["_final_obs"].tolist() == [False, True]
    assert info["final_obs"][1]["state"].tolist() == [2, 2, start]  # its real last observation, not the padding
    sampler = Sampler(config("env.entry_point=test_multiagent:cut_relay_env"))
    segment = sampler.sample()
    scout = segment.active[:-1, 1]
    assert segment.truncated[:, 1].tolist() == [False, True, False, True] * 2  # its cut, then the copy's end
    assert (segment.final_values[1::4, 1] != 0).all()  # bootstrapped where it was cut
    assert sorted(segment.episode_returns.tolist()) == [4.0] * 4 + [20.0] * 4  # episodes as before
    assert segment.episode_lengths.tolist() == [4] * 8
    batch = build_batch([segment], 0.9, 1.0, torch.device("cpu"))
    returns = batch.returns.reshape(8, 4)[:, 1]
    assert returns[1] == pytest.approx(segment.rewards[1, 1] + 0.9 * segment.final_values[1, 1])
    assert scout.tolist() == [True, True, False, False] * 2
    sampler.close()


def test_a_seeded_reset_repeats_its_episodes() -> None:
    first = ParallelVectorEnv([Relay(), Relay()], "relay").reset(seed=5)[0]
    again = ParallelVectorEnv([Relay(), Relay()], "relay").reset(seed=5)[0]
    other = ParallelVectorEnv([Relay(), Relay()], "relay").reset(seed=6)[0]
    assert np.array_equal(first["state"], again["state"]) and not np.array_equal(first["state"], other["state"])


def test_agent_ids_are_one_hot_in_the_observation_padding_included() -> None:
    vec = ParallelVectorEnv([Relay(scout_steps=1, steps=3)], "relay", agent_id_in_obs=True)
    obs, _ = vec.reset(seed=0)
    assert obs["agent_id"].tolist() == [[1, 0], [0, 1]]
    obs, *_ = step(vec)
    assert obs["agent_id"].tolist() == [[1, 0], [0, 1]] and obs["state"][1].tolist() == [0, 0, 0]
    assert vec.single_observation_space["agent_id"] == gym.spaces.Box(0, 1, (2,), np.float32)


def test_agents_with_different_spaces_are_refused_naming_them() -> None:
    with pytest.raises(UsageError) as err:
        ParallelVectorEnv([Odd()], "odd")
    assert "agents 'runner'" in str(err.value) and "'scout'" in str(err.value)
    assert "give them separate policies (policies: {adversary: ['adversary_*']" in str(err.value)


def test_num_envs_counts_env_copies_and_each_copys_agents_are_columns() -> None:
    """env.num_envs 3 of a 2-agent env: 3 copies, 6 columns; the batch counts agent steps."""
    cfg = with_agents(config("run.actors=2", num_envs=3))
    assert cfg.env.columns_per_copy == 2 and cfg.columns == 6 and cfg.batch_size == 2 * 6 * 8
    check_env(cfg)
    sampler = Sampler(cfg)
    assert sampler.num_columns == 6 and sampler.sample().rewards.shape == (8, 6)
    sampler.close()
    spread = with_agents(load_config(None, {"env.id": "mpe2.simple_spread_v3"}))  # the defaults: 8 copies
    assert spread.env.num_envs == 8 and spread.columns == 24


def test_two_halves_split_env_copies_not_agent_columns() -> None:
    """A policy stepped in two halves (the inference service, run.actor_halves=2) gets half of the copies each,
    with all of their agents: 6 copies of 2 agents, two halves of 3 copies (6 columns)."""
    from dppo.rl.worker_thread import own_policy

    cfg = with_agents(config("run.actor_halves=2", num_envs=6))
    plain = Sampler(cfg.model_copy(update={"run": cfg.run.model_copy(update={"actor_halves": 1})}))
    policy = own_policy(plain.envs.single_observation_space, plain.envs.single_action_space, cfg.model,
                        plain.seed, cfg.columns, on_worker=True)
    halves = Sampler(cfg, policy=policy)
    assert [h.num_envs for h in halves.half_envs] == [6, 6] and halves.rows == [slice(0, 6), slice(6, 12)]
    assert halves.sample().rewards.shape == (8, 12)
    for sampler in (plain, halves):
        sampler.close()


def test_the_eval_view_takes_agents_in_turns_and_returns_the_mean_agent_return() -> None:
    env = AgentTurns(Relay(steps=4, scout_steps=2), "relay")
    obs, _ = env.reset(seed=1)
    seen, total, done = [obs["state"][0]], 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(1)
        seen.append(obs["state"][0])
        total += reward
        done = terminated or truncated
    assert total == (4 * 1.0 + 2 * 10.0) / 2  # the runner's 4 and the scout's 20, per agent
    assert truncated and not terminated
    assert seen[:6] == [1, 2, 1, 2, 1, 1]  # runner, scout in turns; the scout left after two rounds
    assert env.metadata["render_fps"] == 10  # frames repeat per agent: videos keep time


def test_a_sampler_counts_one_episode_per_agent_per_env_episode() -> None:
    sampler = Sampler(config())
    segment = sampler.sample()  # 8 steps of 2 copies: each copy ends its 4-step episode twice
    assert segment.obs.vector.shape == (8, 4, 3) and segment.obs.mask.shape == (8, 4, 3)
    assert sorted(segment.episode_returns.tolist()) == [4.0] * 4 + [20.0] * 4
    assert segment.episode_lengths.tolist() == [4] * 8
    assert segment.truncated[:, 0].sum() == 2 and segment.terminated[:, 1].sum() == 2
    assert (segment.final_values[segment.truncated] != 0).all()  # the runner's time limit is bootstrapped
    sampler.close()


def test_the_steps_of_an_agent_that_left_are_kept_out_of_training() -> None:
    """The scout leaves after 2 of each 4-step episode: its next 2 steps are padding. The segment marks them, the
    batch gives them no value (the scout's last step bootstraps from nothing, as its termination should) and keeps
    them out of the losses and the observation statistics."""
    segment = Sampler(config("ppo.segment_length=9", "ppo.minibatch_size=18", "env.normalize_obs=true")).sample()
    scout = segment.active[:, 1]  # column 1: copy 0's scout, its obs t = 0 .. 9 (9: the bootstrap's)
    assert scout.tolist() == [True, True, False, False] * 2 + [True, True]
    assert segment.active[:, [0, 2]].all() and (segment.active[:, 3] == scout).all()
    assert segment.obs_stats.count == segment.active[1:].sum()  # the observation statistics skip padding
    batch = build_batch([segment], 0.9, 1.0, torch.device("cpu"))
    rows = batch.returns.reshape(9, 4)  # time-major rows: step t of column c is row t * 4 + c
    assert batch.active.reshape(9, 4)[:, 1].tolist() == scout[:-1].tolist()
    assert rows[1, 1] == segment.rewards[1, 1]  # its leaving step: its own reward and nothing after
    assert not batch.values.reshape(9, 4)[~scout[:-1], 1].any()
    assert rows[0, 1] == pytest.approx(segment.rewards[0, 1] + 0.9 * segment.rewards[1, 1])
    runner = rows[:, 0]  # the runner's return after step 0 of an episode bootstraps at its time limit (step 3)
    r, cut = segment.rewards[:, 0], segment.final_values[3, 0]  # cut: V(the runner's final observation)
    assert segment.truncated[3, 0] and cut != 0
    assert float(runner[0]) == pytest.approx(r[0] + 0.9 * r[1] + 0.81 * r[2] + 0.729 * (r[3] + 0.9 * cut), rel=1e-5)
    both = build_batch([segment, dataclasses.replace(segment, active=None)], 0.9, 1.0, torch.device("cpu"))
    assert both.active[:36].tolist() == batch.active.tolist() and both.active[36:].all()  # no mask: every row live


def test_the_reward_scale_statistics_skip_the_padding_of_an_agent_that_left() -> None:
    """Padding steps' rewards are 0 but the discounted return they leave behind is not: they must not enter the
    statistics the reward scale divides by. The scout's live steps see returns 10 and 10 + 0.9 x 10 = 19 in each
    episode; the runner's 1, 1.9, 2.71, 3.439."""
    segment = Sampler(config("env.normalize_reward=true", "ppo.gamma=0.9")).sample()
    live = segment.active[:-1]
    assert segment.return_stats.count == live.sum() == 8 * 4 - 8  # 2 copies x 2 episodes x 2 padding steps
    expected = [10.0, 19.0] * 4 + [1.0, 1.9, 2.71, 3.439] * 4
    assert float(segment.return_stats.mean) == pytest.approx(np.mean(expected))
    assert float(segment.return_stats.var) == pytest.approx(np.var(expected))


def test_a_one_agent_parallel_env_samples_exactly_as_its_gymnasium_env() -> None:
    """Same seeds, same actions, same segments: episodes ending by termination and by time limit, final values
    bootstrapped from the final observation, autoreset, episode statistics."""
    common = ["ppo.segment_length=40", "ppo.minibatch_size=40", "run.seed=4"]
    parallel = load_config(None, {"env.entry_point": "test_multiagent:one_agent_env", "env.num_envs": 3},
                           ["env.multiagent=true", "env.kwargs.env_id=CartPole-v1", "env.kwargs.max_episode_steps=12",
                            *common])
    single = load_config(None, {"env.id": "CartPole-v1", "env.num_envs": 3}, ["env.max_episode_steps=12", *common])
    ours, theirs = Sampler(parallel), Sampler(single)
    ours.set_weights(export_weights(theirs.agent.model), 1)  # one policy for both (initial weights come unseeded)
    ours, theirs = ours.sample(), theirs.sample()
    assert ours.truncated.any() and ours.terminated.any()
    for field in ("actions", "rewards", "terminated", "truncated", "final_values", "values", "last_values",
                  "episode_returns", "episode_lengths"):
        assert np.array_equal(getattr(ours, field), getattr(theirs, field)), field
    assert ours.active is None and theirs.active is None  # an agent that never leaves early is never padding
    assert np.array_equal(ours.obs.vector, theirs.obs.vector)


def test_the_start_check_and_the_model_spaces_come_from_one_agent() -> None:
    (obs_space, action_space, first), = check_env(config("env.agent_id_in_obs=true")).values()
    assert set(obs_space.spaces) == {"state", "action_mask", "agent_id"} and action_space == gym.spaces.Discrete(3)
    assert first["agent_id"].tolist() == [1, 0]
    assert make_vector_env(config("env.agent_id_in_obs=true")).single_observation_space == obs_space


def test_a_recurrent_policy_is_refused_for_now() -> None:
    with pytest.raises(EnvLoadError, match=r"model.recurrent 'lstm' .* not supported yet: evaluation plays"):
        check_env(config("model.recurrent=lstm", "ppo.minibatch_size=8"))


@pytest.mark.parametrize(("env_id", "multiagent"), [
    ("mpe2.simple_spread_v3", True), ("pettingzoo.butterfly.pistonball_v6", True), ("CartPole-v1", False),
    ("minigrid:MiniGrid-Empty-5x5-v0", False), ("ALE/Pong-v5", False), ("mysim.agents", False), ("spread_v3", False),
])
def test_pettingzoo_modules_are_told_from_gymnasium_ids_by_name(env_id: str, multiagent: bool) -> None:
    assert load_config(None, {"env.id": env_id}).env.multiagent is multiagent


def test_a_module_of_ones_own_is_named_with_multiagent() -> None:
    cfg = load_config(None, {"env.id": "mpe2.simple_spread_v3", "env.num_envs": 2}, ["env.kwargs.max_cycles=5"])
    env = make_env(cfg.env)
    assert isinstance(env, AgentTurns) and env.num_agents == 3
    mine = load_config(None, {"env.id": "test_multiagent"}, ["env.multiagent=true"])  # this module's parallel_env
    with pytest.raises(EnvLoadError, match=r"module 'test_multiagent' has neither parallel_env\(\) nor env\(\)"):
        make_pettingzoo_env(mine.env)


@pytest.mark.parametrize(("sets", "message"), [
    (["env.vectorization=async"], "stepped with env.vectorization=sync"),
    (["env.max_episode_steps=10"], "set the env's own limit in env.kwargs"),
    (["env.id=mysim:Env-v0", "env.multiagent=true"], "names a module whose parallel_env"),
])
def test_what_a_multiagent_env_cannot_take_is_one_line(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, {"env.id": "mpe2.simple_spread_v3"}, sets)


def test_agent_ids_need_a_multiagent_env() -> None:
    with pytest.raises(ConfigError, match=r"env\.agent_id_in_obs applies to multi-agent envs"):
        load_config(None, {}, ["env.agent_id_in_obs=true"])


def test_a_missing_package_is_named_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in sys.modules if name.startswith(("mpe2.", "pettingzoo.butterfly"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mpe2", None)  # as if mpe2 were not installed
    with pytest.raises(EnvLoadError, match=r"cannot import the PettingZoo env module 'mpe2.simple_spread_v3' .*"
                                           r"pip install mpe2$"):
        make_pettingzoo_env(load_config(None, {"env.id": "mpe2.simple_spread_v3"}).env)
    monkeypatch.setitem(sys.modules, "pymunk", None)  # butterfly's own dependency
    with pytest.raises(EnvLoadError, match=r"pip install 'pettingzoo\[butterfly\]'$"):
        make_pettingzoo_env(load_config(None, {"env.id": "pettingzoo.butterfly.pistonball_v6"}).env)


@pytest.mark.parametrize(("entry_point", "wrappers", "message"), [
    ("test_multiagent:a_gymnasium_env", [], "not a PettingZoo ParallelEnv"),
    ("test_multiagent:relay_env", ["FlattenObservation"], "functions of the PettingZoo env"),
])
def test_what_is_not_a_pettingzoo_env_is_named(entry_point: str, wrappers: list[str], message: str) -> None:
    cfg = load_config(None, {"env.entry_point": entry_point}, ["env.multiagent=true"])
    cfg.env.wrappers = [{"name": w} for w in wrappers]
    with pytest.raises(EnvLoadError, match=message):
        make_pettingzoo_env(cfg.env)


def test_wrappers_wrap_the_parallel_env_in_order() -> None:
    pytest.importorskip("supersuit")
    cfg = config()
    cfg.env.wrappers = [{"name": "supersuit:clip_reward_v0", "kwargs": {"lower_bound": 0, "upper_bound": 2}}]
    vec = make_vector_env(cfg)
    vec.reset(seed=0)
    assert step(vec)[1].tolist() == [1.0, 2.0, 1.0, 2.0]  # the scout's 10 clipped


def test_an_aec_env_whose_agents_can_act_at_once_runs_through_pettingzoos_conversion() -> None:
    cfg = load_config(None, {"env.entry_point": "mpe2.simple_spread_v3:env", "env.num_envs": 1},
                      ["env.multiagent=true", "env.kwargs.max_cycles=5"])
    cfg.env.wrappers = [{"name": "pettingzoo.utils.conversions:aec_to_parallel"}]
    vec = make_vector_env(cfg)
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (3, 18) and step(vec)[1].shape == (3,)
    cfg.env.wrappers = []
    with pytest.raises(EnvLoadError, match=r"env.wrappers: \[pettingzoo.utils.conversions:aec_to_parallel\]"):
        make_vector_env(cfg)


def test_benchmarks_take_pettingzoo_modules_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from dppo.bench.common import check_env_id

    assert check_env_id("mpe2.simple_spread_v3") == "mpe2.simple_spread_v3"
    for name in [name for name in sys.modules if name.startswith("mpe2.")]:  # imported by earlier tests
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mpe2", None)  # as if mpe2 were not installed
    with pytest.raises(UsageError, match=r"PettingZoo env module 'mpe2\.simple_spread_v3' cannot be imported"):
        check_env_id("mpe2.simple_spread_v3")
