"""A learner of the group (run.learners=2) that dies is replaced; a crash loop ends the run with a checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from runs import progress_records, run_workers, wait_for_iterations

from dppo.run.checkpoint import newest_intact

BATCH = 2 * 4 * 64  # actors x envs x segment length


def start_train(address: str, run_dir: Path, total_steps: int, *sets: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dppo", "train", "--address", address, "--run-dir", str(run_dir),
           "--envs-per-actor", "4", "--segment-length", "64", "--total-steps", str(total_steps),
           "--no-tensorboard", "--set", "ppo.minibatch_size=128", "--set", "run.learners=2",
           "--set", "run.checkpoint_every=1", *(arg for s in sets for arg in ("--set", s))]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def kill_a_learner_after(run_dir: Path, proc: subprocess.Popen, iterations: int) -> int:
    """SIGKILL learner 1's process (a `ray::Learner` started by this run) once ``iterations`` are done; the
    iterations done when it was killed."""
    wait_for_iterations(run_dir, iterations, proc, timeout=180)
    learners = run_workers(proc.pid, "ray::Learner")  # this run's, not another test's beside it
    assert len(learners) == 2, learners
    learners[-1].send_signal(signal.SIGKILL)
    return len(progress_records(run_dir))


def finish(proc: subprocess.Popen) -> str:
    try:
        return proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_killed_learner_is_replaced_and_no_iteration_is_lost(ray_address: str, tmp_path: Path) -> None:
    """The run's end is SIGTERM, two iterations after the kill (the interrupted one retried, one more): no budget
    that a fast machine could spend before the kill lands."""
    run_dir = tmp_path / "run"
    proc = start_train(ray_address, run_dir, 200 * BATCH)
    killed_at = kill_a_learner_after(run_dir, proc, 2)
    wait_for_iterations(run_dir, killed_at + 2, proc, timeout=180)
    proc.send_signal(signal.SIGTERM)
    err = finish(proc)
    assert proc.returncode == 143, err
    assert "restarting the 2 learners" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "signal" and summary["learner_restarts"] == 1, summary
    # no iteration lost or repeated: the interrupted one is retried on the same segments
    records = progress_records(run_dir)
    assert len(records) >= killed_at + 2
    assert [r["env_steps"] for r in records] == [BATCH * i for i in range(1, len(records) + 1)]


@pytest.mark.slow
def test_learner_crash_loop_exits_1_with_a_checkpoint(ray_address: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(ray_address, run_dir, 200 * BATCH, "faults.max_learner_restarts=0")
    kill_a_learner_after(run_dir, proc, 2)
    err = finish(proc)
    assert proc.returncode == 1, err
    assert "faults.max_learner_restarts=0" in err
    assert json.loads((run_dir / "summary.json").read_text())["reason"] == "error"
    found = newest_intact(run_dir / "checkpoints")
    assert found is not None and found[1]["counters"]["env_steps"] >= 2 * BATCH
