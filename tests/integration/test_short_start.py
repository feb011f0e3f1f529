"""A run that starts with fewer actors than it asked for, on a real Ray cluster: Ray's own word on whether an
actor is placed (the GCS's actor table, read by RayCalls.placement), the one line a short start prints, and the
actor counts in summary.json."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import ray
from session_ray import CPU_TOKENS

from dppo.distributed.ray_calls import RayCalls


@ray.remote
class SlowToStart:
    def __init__(self) -> None:
        time.sleep(30)  # making its envs, say


def test_placement_tells_an_actor_the_cluster_has_no_room_for_from_one_still_starting(ray_address: str) -> None:
    calls = RayCalls(lambda index, seed: None)
    starting = SlowToStart.options(num_cpus=1).remote()
    no_room = SlowToStart.options(num_cpus=2 * CPU_TOKENS).remote()  # more than the session's cluster has
    try:
        deadline = time.monotonic() + 60
        while not calls.placement(starting).placed and time.monotonic() < deadline:
            time.sleep(0.2)
        placed = calls.placement(starting)
        assert placed.placed is True and placed.node in calls.alive_nodes()
        assert calls.placement(no_room).placed is False
    finally:
        calls.kill(starting)
        calls.kill(no_room)


def test_a_run_that_starts_short_says_so_once_and_counts_its_actors(dppo_cmd: list[str], ray_address: str,
                                                                     tmp_path: Path) -> None:
    """Three actors of 3/8 of the session cluster's CPUs each: two fit (whatever another test holds, at most a
    quarter of them), the third never does."""
    run_dir = tmp_path / "run"
    cmd = [*dppo_cmd, "train", "--address", ray_address, "--run-dir", str(run_dir), "--actors", "3",
           "--total-steps", "2048", "--set", f"run.actor_cpus={CPU_TOKENS * 3 / 8:g}", "--set",
           "faults.min_actors=2",
           "--set", "faults.actor_start_timeout_s=2", "--set", "run.target_return=null"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    starts = [line for line in result.stderr.splitlines() if "training starts with" in line]
    assert len(starts) == 1, result.stderr
    assert ("training starts with 2 of 3 actors after " in starts[0]
            and starts[0].endswith("(faults.actor_start_timeout_s=2, faults.min_actors=2): 1 not placed yet (the "
                                   "cluster has no room for it); it joins when ready"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["actors"] == {"asked": 3, "alive": 2, "mean_alive": 2.0}
