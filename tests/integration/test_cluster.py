"""What a local run (no --address) does with Ray: starts it beside the learner, and leaves no process behind
when it exits."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

from conftest import processes_with


def test_a_local_run_starts_ray_beside_the_learner_and_leaves_no_process(dppo_cmd: list[str], tmp_path: Path) -> None:
    marker = f"DPPO_TEST_RUN={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | dict([marker.split("=")])
    run_dir = tmp_path / "run"
    done = subprocess.run([*dppo_cmd, "train", "--run-dir", str(run_dir), "--total-steps", "2048",
                           "--set", "run.target_return=null"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    phases = json.loads((run_dir / "summary.json").read_text())["startup_s"]
    assert list(phases) == ["launch", "config", "ray_init", "learner", "actors_ready"]
    deadline = time.monotonic() + 3  # SIGKILL lands at once; left alone, Ray's agents outlive the run by seconds
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []
