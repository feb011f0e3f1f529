"""A stop (SIGTERM, SIGINT) at any moment of `dppo train`, with real processes and real signals (dppo/run/signals.py).

Before training starts the run ends at once with nothing written; once it has started it ends the round in
progress and writes a final checkpoint when anything trained. Exit code 128 + the signal: 130 SIGINT, 143 SIGTERM.
SIGTERM during training is tested in test_faults.py (test_sigterm_writes_final_checkpoint).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from runs import progress_records, wait_for_iterations, wait_until

from dppo.config import load_config
from dppo.run.checkpoint import newest_intact

TRAIN = [sys.executable, "-m", "dppo", "train", "--no-tensorboard"]


def launch(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*TRAIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def gcs_server(proc: subprocess.Popen) -> psutil.Process | None:
    """The local Ray's GCS: the first process ray.init starts (the raylet, its agents and the driver's own
    connection follow before ray.init returns)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    return next((child for child in children if "gcs_server" in child.name()), None)


def send(proc: subprocess.Popen, sig: int) -> None:
    """SIGINT as a terminal's Ctrl-C sends it, to the whole process group (a local Ray's processes included);
    SIGTERM as kill and Kubernetes send it, to the process."""
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)


def finish(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_while_ray_starts_ends_the_run_at_once_with_nothing_written(tmp_path: Path, sig: int) -> None:
    """A local Ray (no --address): the signal lands while ray.init is starting Ray's processes. Ray's own
    handlers (sys.exit(15), the C++ crash dump) must not answer it, and Ray's processes go with the run."""
    run_dir = tmp_path / "run"
    proc = launch("--run-dir", str(run_dir), "--actors", "1")
    gcs = wait_until(lambda: gcs_server(proc), proc, "ray.init to start the GCS", timeout=180)
    send(proc, sig)
    out, err = finish(proc)
    assert proc.returncode == 128 + sig, err
    name = signal.Signals(sig).name
    assert err == f"dppo: stopped by {name} before training started: nothing written\n", err
    assert "received" not in out + err and "Traceback" not in out + err
    assert not run_dir.exists()
    psutil.wait_procs([gcs], timeout=10)
    assert not gcs.is_running() or gcs.status() == psutil.STATUS_ZOMBIE  # Ray's processes did not outlive the run


def test_a_stop_in_the_first_round_writes_complete_files_and_no_checkpoint(tmp_path: Path, ray_address: str) -> None:
    """The run's files are written once the actors are ready; a stop before the first round ends leaves them
    complete (summary.json says why) and no checkpoint: nothing trained. A slow env keeps the round going."""
    run_dir = tmp_path / "run"
    proc = launch("--address", ray_address, "--run-dir", str(run_dir), "--actors", "1", "--set",
                  "env.latency_ms=20")  # the first round takes 64 steps x 8 envs x 20 ms, about 10 s
    wait_until(lambda: (run_dir / "config.yaml").exists(), proc, "the run's files", timeout=180)
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    assert proc.returncode == 143, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "signal" and summary["iterations"] == 0, summary
    assert newest_intact(run_dir / "checkpoints") is None
    assert not (run_dir / "progress.jsonl").exists()  # so the dir takes a new run (or --auto-resume) as it is
    assert load_config(str(run_dir / "config.yaml")).env.latency_ms == 20  # whole: it loads back
    assert "stopped (SIGTERM): return - after 0 env steps, 0 iterations" in out
    assert "Traceback" not in err


def test_sigint_during_training_ends_with_a_checkpoint_and_exit_130(tmp_path: Path, ray_address: str) -> None:
    """Ctrl-C: the round in progress ends, a final checkpoint of every iteration trained, exit 130."""
    run_dir = tmp_path / "run"
    proc = launch("--address", ray_address, "--run-dir", str(run_dir), "--actors", "1", "--total-steps", "10000000",
                  "--set", "run.checkpoint_every=1000")
    wait_for_iterations(run_dir, 2, proc, timeout=180)
    send(proc, signal.SIGINT)
    out, err = finish(proc)
    assert proc.returncode == 130, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "signal"
    _path, state = newest_intact(run_dir / "checkpoints")
    last = progress_records(run_dir)[-1]
    assert state["counters"]["iteration"] == summary["iterations"] == last["iteration"] >= 2
    assert "stopped (SIGINT)" in out and "Traceback" not in err
