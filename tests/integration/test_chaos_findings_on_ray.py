"""What `dppo bench chaos` broke, reproduced one at a time on the session's Ray."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from runs import run_workers
from test_learners_faults import finish, start_train


@pytest.mark.timeout(400)
def test_a_learner_killed_while_the_group_starts_has_the_group_started_again(ray_address: str,
                                                                            tmp_path: Path) -> None:
    """A learner killed before the group met (rendezvous, join, load) ended the run with ActorDiedError; now the
    group is started again and the run trains to the end."""
    run_dir = tmp_path / "run"
    proc = start_train(ray_address, run_dir, 2048)
    try:
        victim = None
        deadline = time.monotonic() + 180
        while victim is None:  # the first learner of this run, killed as soon as its process has its title
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no learner started"
            victim = next(iter(run_workers(proc.pid, "ray::Learner")), None)
            time.sleep(0.02)
        assert not (run_dir / "progress.jsonl").exists()  # killed before the first update
        victim.send_signal(signal.SIGKILL)
        err = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 2048 and summary["reason"] == "total_steps"
