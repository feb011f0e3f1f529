"""The inference service's batch figures without Ray: rows per forward pass, its seconds and the first request's
queue wait, read and reset by ``stats()`` (what `dppo bench driver` reports for run.inference=server)."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import numpy as np
import pytest
import torch

from dppo.config import ModelConfig, load_config
from dppo.distributed.inference import BATCH_WAIT_S, BatchStats, InferenceService
from dppo.distributed.ray_calls import RayCalls
from dppo.distributed.service_supervisor import ServiceSupervisor
from dppo.rl.agent import export_weights
from dppo.rl.build import build_model
from dppo.rl.policy import Request
from dppo.rl.spaces import check_spaces


def test_the_figures_are_exact_counts_and_medians_of_the_recent_batches_and_reset_when_taken() -> None:
    stats = BatchStats(kept=2)
    assert stats.take() == {"batches": 0}
    stats.add(rows=10, forward_s=9.0, queue_s=9.0)  # beyond `kept`: in the counts, not in the medians
    stats.add(rows=4, forward_s=0.002, queue_s=0.001)
    stats.add(rows=4, forward_s=0.004, queue_s=0.003)
    taken = stats.take()
    assert taken["batches"] == 3 and taken["rows_mean"] == pytest.approx(6.0)
    assert taken["forward_s_total"] == pytest.approx(9.006)
    assert taken["forward_s_median"] == pytest.approx(0.003) and taken["queue_s_median"] == pytest.approx(0.002)
    assert stats.take() == {"batches": 0} and not stats.recent


def service(expected: int) -> tuple[InferenceService, list[Request]]:
    """A service on the CPU holding version 0 of a CartPole MLP, and three requests of 3, 1 and 2 rows."""
    env = gym.make("CartPole-v1")
    config = ModelConfig()
    torch.manual_seed(0)
    weights = export_weights(build_model(env.observation_space, env.action_space, config))
    served = InferenceService(env.observation_space, env.action_space, config, "cpu", expected,
                              threads=torch.get_num_threads())
    asyncio.run(served.load(weights, 0))
    encode = check_spaces(env.observation_space, env.action_space, config)[0].encode
    rng = np.random.default_rng(0)
    return served, [Request(0, encode(rng.normal(size=(n, 4)).astype(np.float32))) for n in (3, 1, 2)]


def test_a_full_batch_counts_all_its_rows_in_one_forward_pass_and_stats_resets() -> None:
    served, requests = service(expected=3)

    async def round_() -> dict[str, float]:
        await asyncio.gather(*(served.act(r) for r in requests))
        return await served.stats()

    taken = asyncio.run(round_())
    assert taken["batches"] == 1 and taken["rows_mean"] == 6
    assert 0 < taken["forward_s_median"] == pytest.approx(taken["forward_s_total"])
    assert 0 <= taken["queue_s_median"] < BATCH_WAIT_S  # full at once: it did not wait for the timer
    assert asyncio.run(served.stats()) == {"batches": 0}


def test_a_batch_short_of_expected_runs_after_the_wait_and_says_how_long_its_first_request_waited() -> None:
    served, requests = service(expected=4)

    async def round_() -> dict[str, float]:
        await asyncio.gather(*(served.act(r) for r in requests[:2]))
        return await served.stats()

    taken = asyncio.run(round_())
    assert taken["batches"] == 1 and taken["rows_mean"] == 4
    assert taken["queue_s_median"] >= BATCH_WAIT_S


def test_without_a_service_the_driver_reads_no_figures() -> None:
    env = gym.make("CartPole-v1")
    unstarted = ServiceSupervisor(load_config(), env.observation_space, env.action_space, "cpu", print,
                          calls=RayCalls(lambda index, seed: None))  # no start(): no service to ask
    assert unstarted.handle is None and unstarted.batch_stats() == {}
