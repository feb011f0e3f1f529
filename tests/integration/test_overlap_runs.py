"""Actors running their own policy in two halves (run.actor_halves=2, no GPU share) on real Ray: a seeded run
trains and gives the in-actor run's progress; a GPU share that no node of the cluster has is one line, not a wait."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from runs import progress_records, train_small, without_timings

train = partial(train_small, total_steps=1536)


@pytest.mark.slow
def test_actors_stepping_two_halves_train_as_the_in_actor_run(ray_address: str, tmp_path: Path) -> None:
    halved = train(ray_address, tmp_path / "halves", "--set", "run.actor_halves=2", "--set", "run.actor_gpus=0")
    assert halved.returncode == 0, halved.stderr
    plain = train(ray_address, tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr
    runs = without_timings(progress_records(tmp_path / "halves"))
    assert len(runs) == 3 and runs[-1]["env_steps"] == 1536
    # an MLP draws from the actor's stream either way: the same run
    assert runs == without_timings(progress_records(tmp_path / "plain"))


def test_a_gpu_share_no_node_has_is_one_line_and_nothing_written(ray_address: str, tmp_path: Path) -> None:
    done = train(ray_address, tmp_path / "gpu", "--set", "run.actor_gpus=0.5")
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "run.actor_gpus=0.5 asks Ray for a GPU share per actor" in lines[0]
    assert "no node of the Ray cluster has 0.5 GPU" in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "gpu").exists()
