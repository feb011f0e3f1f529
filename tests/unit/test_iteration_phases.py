"""Where an iteration's sampling time goes (issue 35, item 4): of the slowest actor's sampling, the seconds stepping
its envs and in its policy, in progress.jsonl (env_s, inference_s) and as phases of dppo_iteration_phase_seconds.
The coordinator's whole loop runs in-process as in test_coordinator (real samplers, fake Ray calls)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from fake_ray import FakeRayCalls, Script

from dppo.config import load_config
from dppo.distributed.actor import Actor
from dppo.distributed.actor_pool import ActorPool
from dppo.envs.make import env_spec
from dppo.rl.sampler import Sampler
from dppo.run.coordinator import Coordinator
from dppo.run.reporting import sampling_phases

pytestmark = pytest.mark.usefixtures("keep_signal_handlers")  # tests/conftest.py

ENVS, STEPS, LATENCY_MS = 2, 16, 2


def test_the_sampling_phases_are_the_slowest_segments_own() -> None:
    cfg = load_config(overrides={"env.num_envs": 2, "ppo.segment_length": 4, "ppo.minibatch_size": 8})
    segment = Sampler(cfg).sample()
    fast = dataclasses.replace(segment, sample_seconds=1.0, env_seconds=0.6, policy_seconds=0.3)
    slow = dataclasses.replace(segment, sample_seconds=2.0, env_seconds=0.5, policy_seconds=1.2)
    assert sampling_phases([fast, slow]) == {"sample": 2.0, "env": 0.5, "inference": 1.2}
    assert sampling_phases([slow, fast]) == {"sample": 2.0, "env": 0.5, "inference": 1.2}


def test_a_runs_progress_and_metrics_say_how_much_of_sampling_was_env_stepping_and_inference(tmp_path: Path) -> None:
    """Each env step takes at least LATENCY_MS (env.latency_ms), so each segment's env seconds are at least
    STEPS x ENVS of them; env_s and inference_s never add up to more than sample_s, and the metrics hold the
    same seconds as the records."""
    cfg = load_config(overrides={
        "env.id": "CartPole-v1", "env.num_envs": ENVS, "ppo.segment_length": STEPS, "ppo.minibatch_size": 32,
        "ppo.epochs": 1, "model.hidden_sizes": [8], "run.actors": 2, "run.total_steps": 3 * 2 * ENVS * STEPS,
        "run.target_return": None, "run.tensorboard": False, "run.checkpoint_every": 100, "run.seed": 3,
        "env.latency_ms": LATENCY_MS})
    samplers: dict[tuple[int, int], Actor] = {}
    spec = env_spec(cfg)

    def sample(index: int, seed: int, broadcast: Any) -> Any:
        return samplers.setdefault((index, seed), Actor(cfg, index, seed, spec)).sample(broadcast)

    coordinator = Coordinator(cfg, tmp_path)
    coordinator.pool = ActorPool(cfg, coordinator.reporter, coordinator.pool.should_stop,
                                 FakeRayCalls(lambda i, n: Script(), sample))
    try:
        coordinator.start()
        coordinator.run()
    finally:
        coordinator.shutdown()
    records = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for record in records:
        assert record["env_s"] >= STEPS * ENVS * LATENCY_MS / 1000
        assert record["inference_s"] > 0
        assert record["env_s"] + record["inference_s"] <= record["sample_s"]
    registry = coordinator.reporter.metrics.registry
    for phase, key in (("env", "env_s"), ("inference", "inference_s")):
        labels = {"phase": phase}
        assert registry.get_sample_value("dppo_iteration_phase_seconds_count", labels) == len(records)
        assert registry.get_sample_value("dppo_iteration_phase_seconds_sum", labels) == pytest.approx(
            sum(r[key] for r in records))
