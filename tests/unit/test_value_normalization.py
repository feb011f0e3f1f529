"""ppo.normalize_value: the value head learns standardized returns; GAE, the value loss and the checkpoint see the
right scale. The math against hand-computed numbers; a short in-process CartPole run with it on trains."""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np
import pytest
import torch

from dppo.config import load_config
from dppo.envs.make import env_spaces
from dppo.rl.agent import export_weights
from dppo.rl.batch import build_batch
from dppo.rl.model import ActorCritic
from dppo.rl.normalizer import ValueNormalizer
from dppo.rl.ppo import Trainer, explained_variance
from dppo.rl.sampler import Sampler
from dppo.rl.segment import Segment
from dppo.rl.spaces import Obs

STD = math.sqrt(4 + 1e-8)  # the statistics of returns {0, 4}: mean 2, variance 4


def segment(version: int) -> Segment:
    """Two env columns, two steps; values as the head gives them (normalized). Column 1 is cut by a time limit at
    t=0, bootstrapped from its final observation's value."""
    two = np.zeros((2, 2), np.float32)
    return Segment(
        obs=Obs(vector=np.zeros((2, 2, 4), np.float32)), actions=np.zeros((2, 2), np.int64), log_probs=two,
        values=np.array([[0.5, 0.5], [-0.5, -0.5]], np.float32), rewards=np.ones((2, 2), np.float32),
        terminated=np.zeros((2, 2), bool), truncated=np.array([[False, True], [False, False]]),
        final_values=np.array([[0.0, 1.0], [0.0, 0.0]], np.float32), last_values=np.array([0.25, 0.25], np.float32),
        episode_returns=np.zeros(0), episode_lengths=np.zeros(0, np.int64), policy_version=version, actor_id=0,
        sample_seconds=0.0)


def test_statistics_standardize_and_turn_back_by_version() -> None:
    norm = ValueNormalizer()
    np.testing.assert_allclose(norm.to_returns(np.array([1.5]), 0), [1.5], rtol=1e-6)  # before any update: as is
    norm.update(np.array([0.0, 4.0]), 1)
    assert norm.version == 1 and float(norm.stats.mean) == 2.0 and float(norm.stats.var) == 4.0
    assert float(norm.normalize(torch.tensor(5.0))) == pytest.approx(1.5)
    np.testing.assert_allclose(norm.to_returns(np.array([1.5, -1.0]), 1), [5.0, 0.0], rtol=1e-6, atol=1e-6)
    norm.update(np.array([10.0, 10.0]), 2)  # version 2: {0, 4, 10, 10}, mean 6, variance (36 + 4 + 16 + 16) / 4 = 18
    np.testing.assert_allclose(norm.to_returns(np.array([1.5]), 1), [5.0], rtol=1e-6)  # version 1's own statistics
    np.testing.assert_allclose(norm.to_returns(np.array([1.5]), 2), [6 + 1.5 * math.sqrt(18)], rtol=1e-6)
    for version in range(3, 3 + ValueNormalizer.KEEP):
        norm.update(np.array([6.0]), version)
    assert 1 not in norm.history  # too old: the current statistics stand in
    np.testing.assert_allclose(norm.to_returns(np.array([1.5]), 1), norm.to_returns(np.array([1.5]), norm.version))


def test_gae_runs_on_values_in_the_returns_scale() -> None:
    """Recorded [0.5, -0.5] with mean 2, std 2 are V = [3, 1]; V(s_T) = 2 + 2 x 0.25 = 2.5; column 1's final
    value 2 + 2 x 1 = 4. gamma 0.5, lambda 1: A_1 = 1 + 0.5 x 2.5 - 1 = 1.25; column 0: A_0 = 1 + 0.5 x 1 - 3 +
    0.5 x 1.25 = -0.875; column 1 (cut at t=0): A_0 = 1 + 0.5 x 4 - 3 = 0. Returns = A + V."""
    norm = ValueNormalizer()
    norm.update(np.array([0.0, 4.0]), 1)
    norm.update(np.array([50.0, 70.0]), 2)  # the learner has moved on: the segment's version 1 still decides
    batch = build_batch([segment(version=1)], 0.5, 1.0, torch.device("cpu"), norm)
    rows = [(0, 0), (0, 1), (1, 0), (1, 1)]  # (t, column): time-major rows of a feed-forward batch
    advantages = {(0, 0): -0.875, (0, 1): 0.0, (1, 0): 1.25, (1, 1): 1.25}
    values = {(0, 0): 3.0, (0, 1): 3.0, (1, 0): 1.0, (1, 1): 1.0}
    np.testing.assert_allclose(batch.values.numpy(), [values[r] for r in rows], rtol=1e-6)
    np.testing.assert_allclose(batch.advantages.numpy(), [advantages[r] for r in rows], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(batch.returns.numpy(), [advantages[r] + values[r] for r in rows], rtol=1e-6)


def test_without_normalization_the_batch_holds_the_recorded_values() -> None:
    batch = build_batch([segment(version=1)], 0.5, 1.0, torch.device("cpu"))
    np.testing.assert_array_equal(batch.values.numpy(), [0.5, 0.5, -0.5, -0.5])


def _trainer(normalize_value: bool) -> Trainer:
    cfg = load_config(sets=[f"ppo.normalize_value={normalize_value}", "ppo.gamma=0.5", "ppo.gae_lambda=1.0",
                            "ppo.minibatch_size=4", "ppo.learning_rate=1e-9"])
    torch.manual_seed(0)
    return Trainer(ActorCritic(*env_spaces(cfg), cfg.model), cfg.ppo, num_iterations=10, seed=0,
                   device=torch.device("cpu"))


def test_the_update_merges_its_returns_and_reports_in_the_returns_scale() -> None:
    trainer = _trainer(normalize_value=True)
    assert trainer.value_normalizer is not None
    trainer.value_normalizer.update(np.array([0.0, 4.0]), 1)
    stats = trainer.train_on([segment(version=1)], 0, 2)
    returns = [2.125, 3.0, 2.25, 2.25]  # A + V of the hand-computed case above
    assert trainer.value_normalizer.version == 2
    assert float(trainer.value_normalizer.stats.mean) == pytest.approx(np.mean([0.0, 4.0, *returns]))
    assert float(trainer.value_normalizer.stats.var) == pytest.approx(np.var([0.0, 4.0, *returns]))
    assert stats.explained_variance == pytest.approx(explained_variance(np.array([3.0, 3.0, 1.0, 1.0]),
                                                                        np.array(returns)), rel=1e-5)
    assert math.isfinite(stats.value_loss)


def test_statistics_live_in_the_trainer_state_and_an_older_state_loads() -> None:
    trainer = _trainer(normalize_value=True)
    trainer.train_on([segment(version=0)], 0, 1)
    trainer.train_on([segment(version=1)], 1, 2)
    buffer = io.BytesIO()
    torch.save(trainer.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # how checkpoints load
    restored = _trainer(normalize_value=True)
    restored.load_state_dict(state)
    assert restored.value_normalizer is not None and trainer.value_normalizer is not None
    assert restored.value_normalizer.version == 2
    assert restored.value_normalizer.to_state() == trainer.value_normalizer.to_state()
    older = {key: value for key, value in state.items() if key != "value_normalizer"}  # written before the option
    fresh = _trainer(normalize_value=True)
    fresh.load_state_dict(older)
    assert fresh.value_normalizer is not None and fresh.value_normalizer.version == 0
    assert "value_normalizer" not in _trainer(normalize_value=False).state_dict()  # off: the format is unchanged


def test_after_a_restart_from_an_older_trainer_state_the_statistics_follow_the_policy_version() -> None:
    """A learner group restarted with the last checkpoint's trainer state (made version 1) beside newer weights
    (version 5) makes version 6 next; the round sampled with version 6 must be turned back with version 6's
    statistics, not fall back to whatever is current."""
    trainer = _trainer(normalize_value=True)
    trainer.train_on([segment(version=0)], 0, 1)
    checkpoint = trainer.state_dict()
    restarted = _trainer(normalize_value=True)
    restarted.load_state_dict(checkpoint)
    restarted.train_on([segment(version=5)], 5, 6)
    norm = restarted.value_normalizer
    assert norm is not None and norm.version == 6 and 6 in norm.history
    made_6 = norm.history[6].copy()
    restarted.train_on([dataclasses.replace(segment(version=6), rewards=np.full((2, 2), 40.0, np.float32))], 6, 7)
    assert float(norm.stats.mean) != pytest.approx(float(made_6.mean))  # the current statistics moved on
    np.testing.assert_allclose(norm.to_returns(np.array([1.5]), 6), [1.5 * math.sqrt(made_6.var + 1e-8) + made_6.mean],
                               rtol=1e-6)


def test_a_short_cartpole_run_with_value_normalization_trains() -> None:
    """Actor and learner in one process, 2 iterations of 512 steps: the losses stay finite and the normalizer counts
    one version per update (with the values turned back by version, as a real run does). That the critic learns
    with it is a benchmark (`python -m benchmarks learning-checks --only cartpole-value-normalization`)."""
    cfg = load_config(sets=["ppo.normalize_value=true", "ppo.num_minibatches=2", "run.actors=1"])
    torch.manual_seed(cfg.run.seed)
    model = ActorCritic(*env_spaces(cfg), cfg.model)
    trainer = Trainer(model, cfg.ppo, cfg.num_iterations, cfg.run.seed, torch.device("cpu"))
    sampler = Sampler(cfg)
    try:
        for version in range(2):
            sampler.set_weights(export_weights(model), version)
            stats = trainer.train_on([sampler.sample()], version, version + 1)
            assert all(math.isfinite(v) for v in (stats.policy_loss, stats.value_loss, stats.entropy)), stats
    finally:
        sampler.close()
    assert trainer.value_normalizer is not None and trainer.value_normalizer.version == 2
