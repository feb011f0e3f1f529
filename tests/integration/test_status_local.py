"""`dppo status [RUN_DIR ...]` on local runs (dppo/commands/status_local.py, dppo/run/run_status.py): a running run
(told by its run-dir lock), one that finished, one that was killed; with no argument, the runs under ./runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from runs import progress_records, run_dppo, train_small, wait_until


def status(*args: str, cwd: Path | None = None) -> list[dict]:
    done = run_dppo("status", "-o", "json", *args, cwd=cwd, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_running_run_then_killed(tmp_path: Path, ray_address: str) -> None:
    run_dir = tmp_path / "live"
    proc = subprocess.Popen([sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir",
                             str(run_dir), "--actors", "1", "--envs-per-actor", "8", "--segment-length", "64",
                             "--total-steps", "1e7", "--set", "run.checkpoint_every=1", "--set",
                             "run.tensorboard=false"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        wait_until(lambda: (progress_records(run_dir) and list((run_dir / "checkpoints").glob("ckpt-*.pt"))) or None,
                   proc, "an iteration and its checkpoint", timeout=180)
        (live,) = status(str(run_dir))
        assert live["state"] == "running" and f"pid {proc.pid} on " in live["why"], live
        assert live["env"] == "CartPole-v1" and live["iteration"] >= 1 and live["env_steps"] >= 512
        assert live["actor_restarts"] is None and live["hangs"] is None  # said when the run ends
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (dead,) = status(str(run_dir))
    last = progress_records(run_dir)[-1]
    assert dead["state"] == "killed" and "--resume" in dead["why"], dead
    assert dead["iteration"] == last["iteration"] and dead["env_steps"] == last["env_steps"]
    assert dead["last_checkpoint"] == sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.pt"))[-1]


def test_no_argument_lists_the_runs_under_runs(tmp_path: Path, ray_address: str) -> None:
    done = train_small(ray_address, tmp_path / "runs" / "small")
    assert done.returncode == 0, done.stderr
    (tmp_path / "runs" / "notes").mkdir()  # not a run: left out
    (ended,) = status(cwd=tmp_path)
    summary = json.loads((tmp_path / "runs" / "small" / "summary.json").read_text())
    assert ended["run_dir"] == str(Path("runs") / "small") and ended["state"] == "finished", ended
    assert ended["why"] == "trained its total steps"
    assert (ended["iteration"], ended["env_steps"], ended["actor_restarts"], ended["hangs"]) == (
        summary["iterations"], summary["env_steps"], 0, summary.get("hangs", 0))
    table = run_dppo("status", cwd=tmp_path, timeout=60)
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:3] == ["RUN", "STATE", "ENV"]
    assert "runs/small: trained its total steps" in table.stdout


def test_a_path_that_is_no_run_dir_is_one_line_exit_2(tmp_path: Path) -> None:
    done = run_dppo("status", str(tmp_path), timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not a dppo run directory" in done.stderr
