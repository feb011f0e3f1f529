"""Policy maps: agent-name patterns to named policies (dppo.envs.policy_map), each policy's agents as the columns of
its own vector env over one set of env copies (dppo.envs.columns), the joint sampler that steps them with every
policy's actions and returns one segment per policy (dppo.rl.joint), whole evaluation episodes of every policy, and
the run's state, checkpoint and records keyed by policy."""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
from pettingzoo import ParallelEnv

from dppo.config import ConfigError, load_config
from dppo.envs.checks import check_env
from dppo.envs.columns import ParallelEnvs
from dppo.envs.make import make_parallel_envs, policy_spaces
from dppo.envs.policy_map import agents_of, policy_groups
from dppo.errors import UsageError
from dppo.rl.agent import export_weights
from dppo.rl.episodes import JointPlayers
from dppo.rl.joint import JointSampler
from dppo.rl.ppo import TrainStats
from dppo.rl.sampler import Sampler
from dppo.run.checkpoint import CheckpointError, compose, decode, encode, policy_entry
from dppo.run.logs import text_line
from dppo.run.reporting import policy_diagnostics
from dppo.run.state import RunState
from dppo.run.tensorboard import tag

GUARD_MASK = np.array([0, 1], np.int8)  # guards may only press button 1
MAP = {"guard": ["guard_*"], "thief": ["thief"]}


class Heist(ParallelEnv):
    """Two guards and a thief with spaces of their own. Guards see 3 numbers and a mask (Discrete(2), only action 1
    allowed), earn 1 a step and are cut by the time limit (truncated) after ``steps``; the thief sees 5 numbers,
    has 4 actions, earns 10 a step and leaves (terminated) after ``thief_steps``."""

    metadata: ClassVar[dict] = {"name": "heist_v0"}

    def __init__(self, steps: int = 4, thief_steps: int = 2) -> None:
        self.possible_agents = ["guard_0", "guard_1", "thief"]
        self.steps, self.thief_steps = steps, thief_steps
        self.rng = np.random.default_rng()
        self.seen: list[dict] = []

    def observation_space(self, agent: str) -> gym.Space:
        if agent == "thief":
            return gym.spaces.Box(-100, 100, (5,), np.float32)
        return gym.spaces.Dict({"pos": gym.spaces.Box(-100, 100, (3,), np.float32),
                                "action_mask": gym.spaces.MultiBinary(2)})

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(4 if agent == "thief" else 2)

    def _obs(self, agent: str):
        if agent == "thief":
            return np.array([9, self.t, self.start, 0, 0], np.float32)
        who = self.possible_agents.index(agent) + 1
        return {"pos": np.array([who, self.t, self.start], np.float32), "action_mask": GUARD_MASK.copy()}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t, self.start = list(self.possible_agents), 0, float(self.rng.integers(0, 50))
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.seen.append(dict(actions))
        self.t += 1
        rewards = {a: 10.0 if a == "thief" else 1.0 for a in self.agents}
        term = {a: a == "thief" and self.t >= self.thief_steps for a in self.agents}
        trunc = {a: self.t >= self.steps for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rewards, term, trunc, {a: {"t": self.t} for a in self.agents}


def heist_env(**kwargs) -> Heist:
    return Heist(**kwargs)


def config(*sets: str, num_envs: int = 2, policies: dict | None = None):
    return load_config(None, {"env.entry_point": "test_policy_map:heist_env", "env.num_envs": num_envs},
                       ["env.multiagent=true", "ppo.segment_length=8", "ppo.minibatch_size=16",
                        f"policies={MAP if policies is None else policies}", *sets])


def test_each_agent_goes_to_the_one_policy_whose_pattern_it_matches() -> None:
    agents = ["guard_0", "guard_1", "thief"]
    assert agents_of(MAP, agents, "heist") == {"guard": ["guard_0", "guard_1"], "thief": ["thief"]}
    with pytest.raises(UsageError, match=r"agent 'thief' of env 'heist' is mapped to no policy; add a pattern"):
        agents_of({"guard": ["guard_*"]}, agents, "heist")
    with pytest.raises(UsageError, match=r"agent 'guard_0' .* matches the patterns of policies 'a' and 'b'"):
        agents_of({"a": ["guard_*"], "b": ["*_0"], "thief": ["thief"]}, agents, "heist")
    with pytest.raises(UsageError, match=r"policies.cop \['cop_\*'\] matches no agent of env 'heist'"):
        agents_of({**MAP, "cop": ["cop_*"]}, agents, "heist")


def test_a_policy_whose_agents_have_different_spaces_is_refused_naming_them() -> None:
    with pytest.raises(UsageError, match=r"policy 'all': agents 'guard_0' .* and 'thief' .* have different spaces"):
        policy_groups(Heist(), {"all": ["*"]}, "heist")
    groups = policy_groups(Heist(), MAP, "heist")
    assert [(g.name, g.agents, g.action_space) for g in groups] == [
        ("guard", ("guard_0", "guard_1"), gym.spaces.Discrete(2)), ("thief", ("thief",), gym.spaces.Discrete(4))]


def test_each_policy_sees_its_agents_as_columns_with_their_own_spaces_rewards_and_masks() -> None:
    joint = ParallelEnvs([Heist(), Heist()], policy_groups(Heist(), MAP, "heist"), "heist", mask_key="action_mask")
    joint.reset(seed=3)
    guards, thieves = joint.views
    assert (guards.num_envs, thieves.num_envs) == (4, 2)  # 2 copies x 2 guards, 2 copies x 1 thief
    assert joint.batch(0)["pos"][:, 0].tolist() == [1, 2, 1, 2] and joint.batch(1).shape == (2, 5)
    assert joint.batch(0)["action_mask"].tolist() == [[0, 1]] * 4
    (_, guard_reward, *_), (_, thief_reward, *_) = joint.step([np.ones(4, np.int64), np.array([3, 2])])
    assert guard_reward.tolist() == [1.0] * 4 and thief_reward.tolist() == [10.0, 10.0]
    assert joint.envs[0].seen[-1] == {"guard_0": 1, "guard_1": 1, "thief": 3}  # each agent its policy's action


def test_an_agent_that_leaves_early_is_padded_in_its_policy_until_the_copy_ends() -> None:
    joint = ParallelEnvs([Heist(steps=4, thief_steps=2)], policy_groups(Heist(), MAP, "heist"), "heist",
                         mask_key="action_mask")
    joint.reset(seed=0)
    actions = [np.ones(2, np.int64), np.zeros(1, np.int64)]
    joint.step(actions)
    (_, _, g_term, g_trunc, _), (thief_obs, thief_reward, t_term, t_trunc, _) = joint.step(actions)
    assert thief_reward.tolist() == [10.0] and not t_term.any() and not g_term.any()  # the thief left: ends later
    assert thief_obs.tolist() == [[0, 0, 0, 0, 0]]  # black death: its column sees zeros until the copy ends
    joint.step(actions)
    assert "thief" not in joint.envs[0].seen[-1]  # its actions are dropped
    (_, _, g_term, g_trunc, g_info), (_, thief_reward, t_term, t_trunc, t_info) = joint.step(actions)
    assert g_trunc.all() and not g_term.any() and t_term.all() and not t_trunc.any()  # each its own cause
    assert thief_reward.tolist() == [0.0]
    assert t_info["final_obs"][0].tolist() == [0, 0, 0, 0, 0] and g_info["final_obs"][0]["pos"][1] == 4


def test_the_joint_sampler_returns_one_segment_per_policy_stamped_and_reproducible() -> None:
    segments = JointSampler(config()).sample()
    guard, thief = segments
    assert (guard.policy_name, thief.policy_name) == ("guard", "thief")
    assert guard.obs.vector.shape == (8, 4, 3) and guard.obs.mask.shape == (8, 4, 2) and guard.actions.shape == (8, 4)
    assert thief.obs.vector.shape == (8, 2, 5) and (guard.actions == 1).all()  # the guards' mask is applied
    # 8 steps of 2 copies with 4-step episodes: each agent ends 2 episodes, the thief's return its 2 x 10
    assert sorted(guard.episode_returns.tolist()) == [4.0] * 8 and sorted(thief.episode_returns.tolist()) == [20.0] * 4
    assert guard.truncated.sum() == 8 and thief.terminated.sum() == 4 and not guard.terminated.any()
    assert (guard.final_values[guard.truncated] != 0).all()  # the guards' time limit is bootstrapped
    again = JointSampler(config()).sample()
    for ours, theirs in zip(segments, again, strict=True):
        assert np.array_equal(ours.actions, theirs.actions) and np.array_equal(ours.obs.vector, theirs.obs.vector)
    other = JointSampler(config(), actor_id=1).sample()
    assert not np.array_equal(other[1].actions, thief.actions)  # another actor, another stream


def test_a_joint_sampler_whose_env_copy_raises_recreates_that_copy_alone() -> None:
    """Every policy's columns of the copy that raised end there as failures; the other copy goes on, untouched."""
    sampler = JointSampler(config("faults.env_retries=2"))
    sampler.sample()
    calls = {"n": 0}
    broken, other = sampler.joint.envs
    real_step = broken.step

    def flaky(actions: dict):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("the simulator hiccuped")
        return real_step(actions)

    broken.step = flaky
    guard, thief = sampler.sample()
    assert guard.rewards.shape == (8, 4) and thief.rewards.shape == (8, 2)
    assert sampler.joint.envs[0] is not broken and sampler.joint.envs[1] is other
    assert guard.truncated[2, :2].all() and thief.truncated[2, 0] and not guard.terminated[2, :2].any()
    assert (guard.env_failures.count, thief.env_failures.count) == (2, 1)  # each cut agent-episode
    assert "the simulator hiccuped" in guard.env_failures.first


def test_policy_spaces_and_the_start_check_come_from_the_map() -> None:
    spaces = policy_spaces(config())
    assert list(spaces) == ["guard", "thief"]
    assert set(spaces["guard"][0].spaces) == {"pos", "action_mask"} and spaces["thief"][0].shape == (5,)
    checked = check_env(config("env.agent_id_in_obs=true"))
    assert checked["guard"][2]["agent_id"].tolist() == [1, 0] and checked["thief"][2]["observation"].shape == (5,)
    with pytest.raises(UsageError, match="mapped to no policy"):
        check_env(config(policies={"guard": ["guard_*"]}))
    assert len(make_parallel_envs(config(num_envs=4)).envs) == 4  # env.num_envs counts copies


@pytest.mark.parametrize(("sets", "message"), [
    (["env.multiagent=false", "env.entry_point=null", "env.id=CartPole-v1"], "env 'CartPole-v1' is a single-agent"),
    (["run.inference=server"], "run.inference=server serves one policy"),
    (["policies={'bad name': [x]}"], "policy name 'bad name' must start with a letter"),
    (["policies={guard: []}"], r"policies.guard must list agent-name patterns"),
])
def test_a_bad_policy_map_is_one_line(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        config(*sets)
    assert "\n" not in str(err.value)


class PaidHeist(Heist):
    """The heist paid by the buttons pressed: the thief 10 x its button's number, a guard 1 for button 1 (the only
    one its mask allows), 0 for button 0."""

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, term, trunc, infos = super().step(actions)
        paid = {a: 10.0 * actions[a] if a == "thief" else float(actions[a] == 1) for a in rewards}
        return obs, paid, term, trunc, infos


def paid_heist_env(**kwargs) -> PaidHeist:
    return PaidHeist(**kwargs)


def test_joint_players_play_whole_episodes_of_every_policy() -> None:
    """Each policy's agents act with that policy's weights, greedily, within their masks: weights that favour the
    thief's button 2 and the guards' button 0 (masked) earn the thief 2 x 20 and each guard 4 x 1."""
    cfg = config("env.entry_point=test_policy_map:paid_heist_env")
    joint = make_parallel_envs(cfg, copies=1)
    players = JointPlayers(joint, cfg)
    sampler = JointSampler(cfg)
    for name, part in sampler.by_policy.items():
        weights = export_weights(part.agent.model)
        weights["policy_head.4.weight"][:] = 0  # the logits: the bias alone
        weights["policy_head.4.bias"][:] = 0
        weights["policy_head.4.bias"][{"guard": 0, "thief": 2}[name]] = 1.0  # greedy: always; sampled: 47%
        players.load(name, weights, 0, None)
    overall, by_policy = players.episodes(3, seed=0)
    assert by_policy == {"guard": [4.0] * 3, "thief": [40.0] * 3}  # whole episodes: 4 guard steps, 2 thief steps
    assert overall == [(4.0 * 2 + 40.0) / 3] * 3  # every agent's mean


def test_state_checkpoint_and_records_are_kept_per_policy() -> None:
    cfg = config("env.normalize_obs=true")
    state = RunState(cfg, {"guard": 3, "thief": 5})
    segments = JointSampler(cfg).sample()
    state.absorb(segments)
    assert state.policies["guard"].obs_stats.mean.shape == (3,) and state.policies["thief"].obs_stats.mean.shape == (5,)
    assert state.policies["thief"].means() == (20.0, 4.0)
    assert state.return_mean() == pytest.approx((8 * 4 + 4 * 20) / 12)  # every agent's episodes
    checkpoint = compose(state, {"guard": {"w": 1}, "thief": {"w": 2}}, {"guard": None, "thief": {"adam": 3}}, None)
    assert checkpoint["model"] is None and checkpoint["obs_stats"] is None
    assert policy_entry(checkpoint, "thief")["trainer"] == {"adam": 3}
    with pytest.raises(CheckpointError, match="has no policy 'cop'"):
        policy_entry(checkpoint, "cop")
    restored = RunState(cfg, {"guard": 3, "thief": 5})
    restored.restore(decode(encode(checkpoint), "test"))
    np.testing.assert_array_equal(restored.policies["thief"].obs_stats.mean, state.policies["thief"].obs_stats.mean)
    assert list(restored.policies["guard"].recent_returns) == [4.0] * 8
    stats = TrainStats(0.1, 2.0, 1.0, 0.01, 0.1, 0.5, 3e-4, 0.2, 4, 0)
    columns = policy_diagnostics(state, {"guard": stats, "thief": stats})
    assert columns["thief/episode_return_mean"] == 20.0 and columns["guard/value_loss"] == 2.0
    assert "value_loss" not in columns and "epochs_run" not in " ".join(columns)
    line = text_line({"iteration": 1, "env_steps": 96, "episodes": 12, **columns})
    assert "| guard return=4.000 pi_loss=0.1000" in line and "| thief return=20.00" in line
    assert tag("thief/value_loss") == "losses/thief/value_loss"


def test_the_joint_sampler_with_one_policy_samples_exactly_what_the_plain_sampler_does() -> None:
    """The joint path (one env stepped with every policy's actions, Sampler.steps driven from outside) against the
    plain Sampler on the same env, seeds and weights: the same segments, field by field, two segments running."""
    pytest.importorskip("mpe2")
    base = ["env.kwargs.max_cycles=10", "ppo.segment_length=32", "ppo.minibatch_size=16"]
    plain = load_config(None, {"env.id": "mpe2.simple_spread_v3", "env.num_envs": 2}, base)
    mapped = load_config(None, {"env.id": "mpe2.simple_spread_v3", "env.num_envs": 2},
                         [*base, "policies={all: ['agent_*']}"])
    ours, theirs = JointSampler(mapped), Sampler(plain)
    ours.samplers[0].set_weights(export_weights(theirs.agent.model), 0)
    for _ in range(2):
        (mine,), reference = ours.sample(), theirs.sample()
        for field in ("actions", "log_probs", "values", "rewards", "terminated", "truncated", "final_values",
                      "last_values", "episode_returns", "episode_lengths"):
            assert np.array_equal(getattr(mine, field), getattr(reference, field)), field
        assert np.array_equal(mine.obs.vector, reference.obs.vector) and mine.policy_name == "all"
