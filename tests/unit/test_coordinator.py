"""The coordinator's whole loop in-process: real samplers (dppo.distributed.actor.Actor, no Ray), the learner in
the driver, the run's files and sinks, with the actor pool on fake Ray calls and fake time. A run that loses
an actor mid-run: smaller rounds while its replacement starts, exact env-step accounting, and summary.json's
actor and fault counts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from fake_ray import Call, FakeRayCalls, Script, crash

from dppo.config import Config, load_config
from dppo.distributed.actor import Actor
from dppo.distributed.actor_pool import ActorPool
from dppo.envs.make import env_spec
from dppo.run import timing
from dppo.run.coordinator import Coordinator

pytestmark = pytest.mark.usefixtures("keep_signal_handlers")  # tests/conftest.py

ENVS, STEPS = 2, 32  # per actor: each segment is ENVS x STEPS env steps


def config(total_steps: int, checkpoint_every: int = 100) -> Config:
    return load_config(overrides={
        "env.id": "CartPole-v1", "env.num_envs": ENVS, "ppo.segment_length": STEPS, "ppo.minibatch_size": 64,
        "ppo.epochs": 1, "model.hidden_sizes": [8], "run.actors": 2, "run.total_steps": total_steps,
        "run.target_return": None, "run.tensorboard": False, "run.checkpoint_every": checkpoint_every,
        "run.seed": 3})


def run(cfg: Config, run_dir: Path, script) -> tuple[dict[str, Any], list[dict[str, Any]], FakeRayCalls]:
    samplers: dict[tuple[int, int], Actor] = {}
    spec = env_spec(cfg)

    def sample(index: int, seed: int, broadcast: Any) -> Any:
        actor = samplers.setdefault((index, seed), Actor(cfg, index, seed, spec))
        return actor.sample(broadcast)

    calls = FakeRayCalls(script, sample)
    ray_before = ray.is_initialized()  # the whole suite's session Ray may be up; this test must not start one
    coordinator = Coordinator(cfg, run_dir)
    coordinator.pool = ActorPool(cfg, coordinator.reporter, coordinator.pool.should_stop, calls)
    try:
        coordinator.start()
        summary = coordinator.run()
    finally:
        coordinator.shutdown()
    assert ray.is_initialized() == ray_before  # all of it ran in this process
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    return summary, records, calls


def test_a_run_on_every_actor_counts_them_all(tmp_path: Path) -> None:
    summary, records, _ = run(config(total_steps=3 * 2 * ENVS * STEPS), tmp_path, lambda i, n: Script())
    assert summary["reason"] == "total_steps" and summary["iterations"] == 3
    assert summary["actors"] == {"asked": 2, "alive": 2, "mean_alive": 2.0}
    assert [r["segments"] for r in records] == [2, 2, 2] and summary["actor_restarts"] == 0
    assert summary["losses"] == {"learners": {}, "evaluation": {}}  # no service: run.inference is actor here


def test_a_run_that_loses_an_actor_trains_on_fewer_segments_until_its_replacement_joins(tmp_path: Path) -> None:
    """Each call takes 1 fake second; actor 1's second call crashes at t=2 s and its replacement has made its envs
    0.5 s later; the next dispatch (t=3 s) finds it: rounds of 2, 1, 1, 2, 2 segments, back after 1.0 s."""
    def script(i: int, n: int) -> Script:
        if (i, n) == (1, 0):
            return Script(calls=lambda k: Call(1.0, error=crash(1) if k == 1 else None))
        return Script(start_s=0.5 if n else 0.0)

    segments = [2, 1, 1, 2, 2]
    summary, records, calls = run(config(total_steps=sum(segments) * ENVS * STEPS), tmp_path, script)
    assert [r["segments"] for r in records] == segments
    assert [r["env_steps_delta"] for r in records] == [s * ENVS * STEPS for s in segments]
    assert summary["env_steps"] == sum(segments) * ENVS * STEPS
    assert summary["actors"] == {"asked": 2, "alive": 2, "mean_alive": round((2 + 1 + 1 + 2 + 2) / 5, 2)}
    assert summary["actor_restarts"] == 1 and summary["actor_crashes"] == 1 and summary["node_losses"] == 0
    assert calls.actors[1].killed and calls.actors[2].index == 1 and calls.actors[2].calls_made == 2
    log = (tmp_path / "train.log").read_text()
    assert "actor 1 crashed (RayActorError: " in log and "actor 1 back after 1.0 s: 2 of 2 actors alive" in log


class IterationClock:
    """dppo.run.timing's clock, faked: a microsecond per reading, and a whole second for each checkpoint written."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-6
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_checkpoint_s_times_the_write_where_one_is_due(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint_s is the phase that writes the checkpoint every run.checkpoint_every iterations: the write's
    second in those, nothing in the others (a fake clock: a busy machine's pauses cannot move it)."""
    clock = IterationClock()
    monkeypatch.setattr(timing, "time", clock)
    write = Coordinator._checkpoint

    def written(self: Coordinator) -> None:
        write(self)
        clock.now += 1.0

    monkeypatch.setattr(Coordinator, "_checkpoint", written)
    _, records, _ = run(config(total_steps=4 * 2 * ENVS * STEPS, checkpoint_every=2), tmp_path, lambda i, n: Script())
    assert [round(r["checkpoint_s"], 3) for r in records] == [0.0, 1.0, 0.0, 1.0]
