"""<run_dir>/train.log: the learner's lines kept with the run (a KubeRay retry deletes the pods' logs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def train(address: str, run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dppo", "train", "--address", address, "--run-dir", str(run_dir),
                           "--envs-per-actor", "4", "--segment-length", "32", "--set", "ppo.minibatch_size=64",
                           "--no-tensorboard", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_every_attempt_appends_its_lines(tmp_path: Path, ray_address: str) -> None:
    run_dir = tmp_path / "run"
    first = train(ray_address, run_dir, "--total-steps", "512")
    assert first.returncode == 0, first.stderr
    lines = (run_dir / "train.log").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in lines[:2]] == first.stdout.splitlines()[:2]  # the stdout lines
    assert lines[-1].split(" ", 1)[1].startswith("stopped (total_steps)")
    second = train(ray_address, run_dir, "--resume", "--total-steps", "1024")
    assert second.returncode == 0, second.stderr
    after = (run_dir / "train.log").read_text().splitlines()
    assert after[:len(lines)] == lines  # appended, nothing lost
    new = [line.split(" ", 1)[1] for line in after[len(lines):]]
    assert new[0].startswith("resuming") and any(line.startswith("iter=4 ") for line in new)


def test_bad_input_writes_no_log(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "dppo", "train", "--run-dir", str(run_dir), "--env", "nosuch:X-v0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and not run_dir.exists()
