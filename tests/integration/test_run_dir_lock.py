"""One run per run directory (dppo/run/lock.py): a second `dppo train` into a directory a live run holds is refused
in one line that names the holder, and touches nothing; a run that died (SIGKILL) holds nothing, so its --resume
goes on. Real processes and the kernel's locks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from runs import progress_records, run_dppo, wait_until

from dppo.run.lock import LOCK_NAME, holder

HOLD = ("import sys; from dppo.run.lock import RunLock; lock = RunLock(sys.argv[1]); lock.acquire(); "
        "print('held', flush=True); sys.stdin.read()")


def contents(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
            for p in sorted(root.rglob("*"))}


def test_a_second_run_into_a_held_run_dir_exits_2_naming_the_holder(tmp_path: Path, ray_address: str) -> None:
    run_dir = tmp_path / "twin"
    holding = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert holding.stdout.readline() == "held\n"
        before = contents(run_dir)
        done = run_dppo("train", "--address", ray_address, "--run-dir", str(run_dir), "--actors", "1",
                        "--total-steps", "512", timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"dppo: error: run dir {str(run_dir)!r} is in use"), done.stderr
        assert f"pid {holding.pid} on {socket.gethostname()} since " in done.stderr, done.stderr
        assert contents(run_dir) == before  # nothing of the holder's touched
        assert holder(run_dir)["pid"] == holding.pid
    finally:
        holding.kill()
        holding.wait()
    assert holder(run_dir) is None  # the kernel let go with the process


def test_a_killed_run_holds_nothing_and_resumes(tmp_path: Path, ray_address: str) -> None:
    """SIGKILL a run after its first checkpoint: its directory is free at once, --resume continues it, and a
    plain second run into it is still refused as the run it is (not as a run in use)."""
    run_dir = tmp_path / "run"
    flags = ["--address", ray_address, "--run-dir", str(run_dir), "--actors", "1", "--envs-per-actor", "8",
             "--segment-length", "64", "--seed", "3", "--set", "run.checkpoint_every=1",
             "--set", "run.tensorboard=false"]
    proc = subprocess.Popen([sys.executable, "-m", "dppo", "train", *flags, "--total-steps", "1e7"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_until(lambda: list((run_dir / "checkpoints").glob("ckpt-*.pt")) or None, proc, "a checkpoint", timeout=180)
        assert holder(run_dir)["pid"] == proc.pid  # the live run holds its directory
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert holder(run_dir) is None and (run_dir / LOCK_NAME).exists()
    again = run_dppo("train", *flags, "--total-steps", "1e7", timeout=120)
    assert again.returncode == 2 and "already holds a run" in again.stderr, again.stderr
    # past what the killed run trained (it may die after its first checkpoint, before that iteration's line: the
    # checkpoint carries the line, and the resume writes it back): the resume trains
    trained = progress_records(run_dir) if (run_dir / "progress.jsonl").exists() else []
    steps = 512 * (len(trained) + 2)
    resumed = run_dppo("train", *flags, "--total-steps", str(steps), "--resume", timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout and progress_records(run_dir)[-1]["env_steps"] == steps
    iterations = [r["iteration"] for r in progress_records(run_dir)]
    assert iterations == list(range(1, len(iterations) + 1))  # one run's lines, once each


def opened(pid: int, path: Path) -> bool:
    """Process ``pid`` has ``path`` open."""
    try:
        return any(os.readlink(fd) == str(path) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def test_a_retried_job_waits_for_the_attempt_before_it(tmp_path: Path, ray_address: str) -> None:
    """--auto-resume (the chart's retries): the attempt before may still hold the directory a while after it died
    (a network file system frees a dead client's lock when its lease ends); the retry waits for it, then runs."""
    run_dir = tmp_path / "retried"
    holding = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert holding.stdout.readline() == "held\n"
    retry = subprocess.Popen([sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir",
                              str(run_dir), "--auto-resume", "--actors", "1", "--total-steps", "512", "--set",
                              "run.tensorboard=false"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: opened(retry.pid, run_dir / LOCK_NAME), retry, "the retry waiting on the lock")
        assert not (run_dir / "config.yaml").exists()  # nothing written while it waits
        holding.kill()
        holding.wait()
        _, err = retry.communicate(timeout=240)
    finally:
        for proc in (holding, retry):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert retry.returncode == 0, err
    assert progress_records(run_dir)[-1]["env_steps"] >= 512
