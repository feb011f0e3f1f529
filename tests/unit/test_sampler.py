"""Sampler on real gymnasium vector envs: shapes, persistence, autoreset, bootstrapping, continuous actions."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from dppo.config import Config, load_config
from dppo.envs.make import env_spec
from dppo.rl.agent import Agent
from dppo.rl.policy import BackendPolicy, Reply, Request
from dppo.rl.sampler import Sampler


def counter_config(num_envs: int = 3, steps: int = 25, **env_kwargs: object) -> Config:
    return load_config(overrides={"env.id": "dppo/Counter-v0", "env.num_envs": num_envs,
                                  "ppo.segment_length": steps, "ppo.minibatch_size": 8,
                                  "env.kwargs": dict(env_kwargs)})


def test_cartpole_segment_has_the_expected_shapes_and_dtypes() -> None:
    cfg = load_config(overrides={"env.num_envs": 4, "ppo.segment_length": 16, "ppo.minibatch_size": 16})
    seg = Sampler(cfg).sample()
    assert seg.obs.vector.shape == (16, 4, 4) and seg.obs.vector.dtype == np.float32
    assert seg.actions.shape == (16, 4) and seg.actions.dtype == np.int64
    for name in ("log_probs", "values", "rewards", "final_values"):
        arr = getattr(seg, name)
        assert arr.shape == (16, 4) and arr.dtype == np.float32, name
    assert seg.terminated.dtype == bool and seg.truncated.dtype == bool
    assert seg.last_values.shape == (4,)
    assert seg.num_steps == 64


def test_env_state_persists_across_segments() -> None:
    """Counter obs = steps since reset: the second segment continues where the first stopped."""
    sampler = Sampler(counter_config(num_envs=2, steps=4))
    first = sampler.sample()
    second = sampler.sample()
    np.testing.assert_array_equal(first.obs.vector[:, 0, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(second.obs.vector[:, 0, 0], [4, 5, 6, 7])


def test_no_transition_crosses_an_episode_boundary() -> None:
    """Time limit 10 (truncation) and termination at 7 in a second config: after a done step comes obs 0."""
    for cfg in (counter_config(steps=25), counter_config(steps=25, terminate_at=7)):
        seg = Sampler(cfg).sample()
        obs = seg.obs.vector[..., 0]
        done = seg.terminated | seg.truncated
        assert done.any()
        for t in range(seg.obs.vector.shape[0] - 1):
            expected = np.where(done[t], 0.0, obs[t] + 1)
            np.testing.assert_array_equal(obs[t + 1], expected)
        assert (seg.episode_lengths == (7 if cfg.env.kwargs else 10)).all()


def test_truncation_bootstrapped_with_value_of_final_obs() -> None:
    sampler = Sampler(counter_config(steps=25))
    seg = sampler.sample()
    rows, cols = np.nonzero(seg.truncated)
    assert len(rows) > 0
    final_obs = np.array([[10.0]], np.float32)  # the time limit is 10 steps, so the final obs is 10
    expected = sampler.agent.value(final_obs)[0]
    np.testing.assert_allclose(seg.final_values[rows, cols], expected, rtol=1e-6)
    assert not seg.final_values[~seg.truncated].any()
    np.testing.assert_allclose(seg.last_values, sampler.agent.value(sampler.obs), rtol=1e-6)


def test_termination_is_not_truncation() -> None:
    seg = Sampler(counter_config(steps=25, terminate_at=7)).sample()
    assert seg.terminated.any() and not seg.truncated.any()
    assert not seg.final_values.any()


def test_continuous_log_prob_uses_unclipped_action() -> None:
    cfg = load_config(overrides={"env.id": "Pendulum-v1", "env.num_envs": 2, "ppo.segment_length": 32,
                                 "ppo.minibatch_size": 8, "model.init_log_std": 1.5})
    sampler = Sampler(cfg)
    seg = sampler.sample()
    assert (np.abs(seg.actions) > 2.0).any(), "with std e^1.5 some actions fall outside [-2, 2]"
    with torch.no_grad():
        flat_obs = torch.as_tensor(seg.obs.vector.reshape(-1, 3))
        dist, _ = sampler.agent.model(flat_obs)
        logp = sampler.agent.model.log_prob(dist, torch.as_tensor(seg.actions.reshape(-1, 1)))
    np.testing.assert_allclose(seg.log_probs.reshape(-1), logp.numpy(), rtol=1e-5, atol=1e-5)


def test_episode_returns_are_raw_when_rewards_are_scaled() -> None:
    cfg = counter_config(steps=25)
    cfg.env.normalize_reward = True
    sampler = Sampler(cfg)
    sampler.sample()
    stats = sampler.sample().return_stats
    assert stats is not None and stats.count == 75  # 25 steps x 3 envs
    from dppo.rl.normalizer import RunningStats

    sampler.learning_reward.stats = RunningStats(np.zeros(()), np.full((), 100.0), 10)
    seg = sampler.sample()
    assert (seg.episode_returns == 10.0).all()  # raw: ten rewards of 1
    np.testing.assert_allclose(seg.rewards, 1 / np.sqrt(100.0 + 1e-8), rtol=1e-6)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_each_vectorization_mode_steps_and_autoresets_the_same(mode: str) -> None:
    cfg = counter_config(num_envs=2, steps=12)
    cfg.env.vectorization = mode
    sampler = Sampler(cfg)
    try:
        seg = sampler.sample()
    finally:
        sampler.close()
    np.testing.assert_array_equal(seg.obs.vector[:12, 0, 0], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1])


def test_a_segment_splits_its_sampling_time_into_env_stepping_and_the_policy() -> None:
    """env.latency_ms makes each env step take at least 5 ms (its wrapper sleeps out the rest, and a fresh env owes
    no overrun), so the T x E steps take at least T x E x 5 ms of the segment's env seconds; the policy's forward
    passes are timed apart from them, and neither counts the other or the actor's own work twice."""
    steps, num_envs = 10, 2
    cfg = load_config(overrides={"env.num_envs": num_envs, "ppo.segment_length": steps, "ppo.minibatch_size": 4,
                                 "env.latency_ms": 5})
    seg = Sampler(cfg).sample()
    assert seg.env_seconds >= steps * num_envs * 0.005
    assert seg.policy_seconds > 0
    assert seg.env_seconds + seg.policy_seconds <= seg.sample_seconds


class SlowService:
    """An in-process inference client whose every reply takes at least ``delay`` seconds (a busy service)."""

    def __init__(self, agent: Agent, delay: float) -> None:
        self.agent, self.delay, self.replies = agent, delay, 0

    def submit(self, request: Request) -> Request:
        return request

    def result(self, request: Request) -> Reply:
        time.sleep(self.delay)
        self.replies += 1
        return Reply(request.version, self.agent.heads(request.obs, request.memory, request.starts))


def test_with_two_halves_the_wait_for_the_service_and_the_stepping_add_up_within_the_segment() -> None:
    steps, num_envs = 8, 4
    cfg = load_config(overrides={"env.num_envs": num_envs, "ppo.segment_length": steps, "ppo.minibatch_size": 4,
                                 "env.latency_ms": 2, "run.inference": "server"})
    env = gym.make(cfg.env.id)
    service = SlowService(Agent(env.observation_space, env.action_space, cfg.model, seed=0), delay=0.003)
    policy = BackendPolicy(env.observation_space, env.action_space, cfg.model, seed=7, num_envs=num_envs,
                           backend=service)
    sampler = Sampler(cfg, seed=7, policy=policy)
    sampler.set_weights({}, 0)
    seg = sampler.sample()
    assert len(sampler.half_envs) == 2
    assert seg.policy_seconds >= service.replies * 0.003 and service.replies >= 2 * steps
    assert seg.env_seconds >= steps * num_envs * 0.002
    assert seg.env_seconds + seg.policy_seconds <= seg.sample_seconds


def test_a_segments_summary_holds_what_the_driver_reads_in_a_few_hundred_bytes() -> None:
    """With learner processes the actor returns (summary, segment) and the driver reads only the summary (issue 56):
    every field the driver reads, equal to the segment's; its size grows with the episodes that finished (their
    returns and lengths, 16 bytes each), not with T, E or the observations."""
    import pickle

    from dppo.distributed.actor import Actor
    from dppo.distributed.broadcast import Broadcast
    from dppo.rl.agent import export_weights
    from dppo.rl.build import build_model

    cfg = load_config(overrides={"env.num_envs": 8, "ppo.segment_length": 128, "ppo.num_minibatches": 1,
                                 "run.learners": 2, "env.normalize_obs": True})
    env = gym.make(cfg.env.id)
    weights = export_weights(build_model(env.observation_space, env.action_space, cfg.model))
    summary, segment = Actor(cfg, 0, 1, env_spec(cfg)).sample(Broadcast(weights, 0, None, None))
    assert summary.num_steps == segment.num_steps == 8 * 128
    for name in ("episode_returns", "episode_lengths"):
        np.testing.assert_array_equal(getattr(summary, name), getattr(segment, name))
    assert (summary.policy_version, summary.actor_id, summary.nonfinite) == (0, 0, False)
    assert summary.obs_stats is segment.obs_stats and summary.sample_seconds == segment.sample_seconds
    episodes = len(summary.episode_returns)
    assert len(pickle.dumps(summary, protocol=5)) < 1024 + 16 * episodes < len(pickle.dumps(segment, protocol=5)) / 10
