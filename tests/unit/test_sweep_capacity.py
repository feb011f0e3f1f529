"""How many trials a cluster holds at once (dppo.sweep.capacity), and the line a sweep prints when it is fewer than
``concurrent`` asks."""

from __future__ import annotations

from pathlib import Path

import yaml

from dppo.sweep.capacity import concurrency_note, trial_needs, trials_at_once
from dppo.sweep.spec import Sweep, load_sweep
from dppo.sweep.trainable import trial_bundles


def sweep(tmp_path: Path, sets: dict | None = None, **spec: object) -> Sweep:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": {"env": "CartPole-v1"}, "set": sets or {},
                                    "space": {"ppo.learning_rate": "loguniform(1e-4, 1e-3)"}, **spec}))
    return load_sweep(path)


def note(s: Sweep, cluster: dict[str, float], local: bool = True) -> str | None:
    return concurrency_note(s, trial_bundles(s), cluster, local)


def test_a_trial_needs_the_sum_of_its_bundles_and_the_scarcest_resource_sets_how_many_fit() -> None:
    needs = trial_needs([{"CPU": 0.5}, {"CPU": 0.1, "GPU": 0.0}, {"CPU": 0.1, "GPU": 1.0}])
    assert needs == {"CPU": 0.7, "GPU": 1.0}
    assert trials_at_once(needs, {"CPU": 7.0, "GPU": 4.0}) == 4  # 7 / 0.7 is 9.999...: still 10 by CPUs
    assert trials_at_once({"CPU": 0.7}, {"CPU": 7.0}) == 10
    assert trials_at_once(needs, {"CPU": 64.0}) == 0  # no GPU at all


def test_the_default_trial_on_a_three_cpu_local_ray_runs_one_at_a_time_and_says_how_to_get_more(
        tmp_path: Path) -> None:
    """The issue's case: 2 asked, a trial of 2.5 Ray CPUs (0.5 + 2 actors x 1) on a local Ray of 3."""
    assert note(sweep(tmp_path), {"CPU": 3.0, "memory": 1e9}) == (
        "sweep 'sweep': 1 trial at a time, not 2 (concurrent: 2): one trial needs 2.5 Ray CPUs (driver_cpus 0.5 + "
        "2 actors x run.actor_cpus 1) and this local Ray has 3; for more at once lower run.actors, run.actor_cpus "
        "or driver_cpus, or join a bigger cluster with --address")
    assert note(sweep(tmp_path), {"CPU": 5.0}) is None  # both fit


def test_fewer_trials_than_concurrent_ask_only_for_themselves(tmp_path: Path) -> None:
    three = sweep(tmp_path, {"run.actors": 1}, trials=1, concurrent=8, name="lr",
                  space={"ppo.learning_rate": "grid([1e-4, 3e-4, 1e-3])"})
    assert three.total_trials() == 3
    assert note(three, {"CPU": 4.5}) is None  # 3 x 1.5 fit: the other 5 of concurrent were never going to run
    line = note(three, {"CPU": 3.0})
    assert line is not None and line.startswith("sweep 'lr': 2 trials at a time, not 3 (concurrent: 8, 3 trials): ")


def test_a_joined_cluster_may_grow_and_one_too_small_for_a_trial_starts_none(tmp_path: Path) -> None:
    learners = sweep(tmp_path, {"run.actors": 4, "run.actor_cpus": 0.5, "run.learners": 2,
                                "run.learner_cpus": 2}, driver_cpus=0.25)
    assert note(learners, {"CPU": 6.0}, local=False) == (
        "sweep 'sweep': one trial needs 6.25 Ray CPUs (driver_cpus 0.25 + 4 actors x run.actor_cpus 0.5 + 2 learners "
        "x run.learner_cpus 2) and the cluster has 6: trials wait until it grows (an autoscaler adds nodes for "
        "them); lower run.actors, run.actor_cpus or driver_cpus, or add nodes")
    line = note(learners, {"CPU": 12.4}, local=False)
    assert line is not None and line.startswith("sweep 'sweep': 1 trial at a time, not 2 (concurrent: 2): ")
    assert "the cluster has 12.4 (more start if it autoscales); " in line
    assert note(learners, {"CPU": 12.5}, local=False) is None
