"""Normalizer statistics merged across actors equal the statistics of the pooled data."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dppo.config import load_config
from dppo.rl.normalizer import RunningStats
from dppo.rl.sampler import Sampler

sizes = st.lists(st.integers(1, 40), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(chunks=sizes, seed=st.integers(0, 2**16))
def test_merged_stats_equal_the_stats_of_the_pooled_data(chunks: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = [rng.normal(3.0, 2.0, size=(n, 3)) for n in chunks]
    merged = RunningStats.empty((3,))
    for part in parts:
        merged = merged.merge(RunningStats.of(part))
    pooled = np.concatenate(parts)
    np.testing.assert_allclose(merged.mean, pooled.mean(0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(merged.var, pooled.var(0), rtol=1e-9, atol=1e-9)
    assert merged.count == len(pooled)


def test_two_actors_deltas_merge_to_pooled_observations() -> None:
    """Each actor reports its segment's observation statistics; the learner's merge equals the pooled data."""
    cfg = load_config(overrides={"env.id": "Pendulum-v1", "env.num_envs": 2, "ppo.segment_length": 50,
                                 "ppo.minibatch_size": 8, "env.normalize_obs": True})
    raw_obs = []
    deltas = []
    for actor in range(2):
        sampler = Sampler(cfg, actor_id=actor)
        seen = []
        step = sampler.envs.step

        def recording_step(action, step=step, seen=seen):
            out = step(action)
            seen.append(out[0].copy())
            return out

        sampler.envs.step = recording_step
        deltas.append(sampler.sample().obs_stats)
        raw_obs.append(np.concatenate(seen))
    merged = RunningStats.empty((3,)).merge(deltas[0]).merge(deltas[1])
    pooled = np.concatenate(raw_obs).astype(np.float64)
    np.testing.assert_allclose(merged.mean, pooled.mean(0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(merged.var, pooled.var(0), rtol=1e-6, atol=1e-8)
    assert merged.count == len(pooled) == 200


def test_normalize_clips_to_the_given_bound() -> None:
    stats = RunningStats(np.zeros(2), np.ones(2), 10)
    np.testing.assert_allclose(stats.normalize(np.array([100.0, -0.5]), clip=10), [10.0, -0.5], rtol=1e-6)
