"""A run as a test sees it: `dppo` and the benchmarks started as a user starts them, and what a run leaves to read
(its progress records, waited for while it goes on; its processes; the one line a failed run ends with)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dppo.run.run_dir import RunDir

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def run_dppo(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m dppo ARGS` as a user runs it, output captured."""
    return subprocess.run([sys.executable, "-m", "dppo", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


def run_benchmark(*args: str, cwd: Path | None = None, timeout: float = 300,
                  ray_address: str | None = None) -> subprocess.CompletedProcess:
    """`python -m benchmarks ARGS` as from a clone (the clone's root on the path, whatever ``cwd``), output captured;
    its runs join ``ray_address`` (RAY_ADDRESS) when given."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def train_small(ray_address: str, run_dir: Path, *args: str, total_steps: int = 2048) -> subprocess.CompletedProcess:
    """A short seeded CartPole `dppo train` on the session's cluster (2 actors x 4 envs x 64 steps), output captured."""
    return run_dppo("train", "--address", ray_address, "--run-dir", str(run_dir), "--actors", "2", "--envs-per-actor",
                    "4", "--segment-length", "64", "--total-steps", str(total_steps), "--seed", "3", "--set",
                    "run.tensorboard=false", *args, timeout=240)


def progress_records(run: Path) -> list[dict]:
    """A run directory's progress.jsonl, one dict per iteration, read as dppo reads it (:meth:`RunDir.read_progress`:
    a torn last line, being written now, left out); readable while the run goes on: none before its first line."""
    run_dir = RunDir(run)
    return run_dir.read_progress() if run_dir.progress.exists() else []


def without_timings(records: list[dict]) -> list[dict]:
    """The records less their wall-clock keys (``*_s``): what a seeded run must reproduce exactly."""
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in records]


def wait_until(found: Callable[[], T | None], proc: subprocess.Popen, what: str, timeout: float = 120) -> T:
    """Poll ``found()`` until it returns something other than None or False, the process ``proc`` alive meanwhile;
    what it returned. A failure names what was awaited, with the process's output when it exited first."""
    deadline = time.monotonic() + timeout
    while (result := found()) is None or result is False:
        if proc.poll() is not None:
            out, err = (text.decode(errors="replace") if isinstance(text, bytes) else text or ""
                        for text in proc.communicate())
            raise AssertionError(f"the process exited ({proc.returncode}) before {what}:\n{out[-2000:]}\n{err[-3000:]}")
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.05)
    return result


def wait_for_records(run: Path, proc: subprocess.Popen, done: Callable[[list[dict]], bool], what: str,
                     timeout: float = 120) -> list[dict]:
    """The run's progress records once they are ``done`` (see :func:`wait_until`); a failure adds the last record."""
    try:
        return wait_until(lambda: records if done(records := progress_records(run)) else None, proc, what, timeout)
    except AssertionError as failure:
        raise AssertionError(f"{failure}\nthe last record: {progress_records(run)[-1:]}") from None


def wait_for_iterations(run: Path, count: int, proc: subprocess.Popen, timeout: float = 120,
                        segments: int = 0) -> list[dict]:
    """Until ``count`` iterations are done and the newest had at least ``segments`` segments (e.g. every actor's)."""
    what = f"{count} iterations" + (f" with the last of {segments} segments" if segments else "")
    return wait_for_records(run, proc, lambda records: len(records) >= count and records[-1]["segments"] >= segments,
                            what, timeout)


def run_workers(driver: int, title: str) -> list[Any]:
    """The live Ray worker processes titled ``title`` (``ray::Actor``, ``ray::Learner``...) of the run whose driver
    is process ``driver``, on the session's cluster: found by their job (each worker's RAY_JOB_ID, the job's driver
    pid in the GCS), never another test's run beside it. The test's process must have joined the cluster
    (ray_address)."""
    import psutil
    import ray._private.state

    jobs = {job["JobID"] for job in ray._private.state.state.job_table() if job["DriverPid"] == driver}
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.info["cmdline"] or []).startswith(title) and proc.environ().get("RAY_JOB_ID") in jobs:
                found.append(proc)
    return found


def processes_with(marker: str) -> list[int]:
    """Pids whose environment holds ``marker`` (a run's processes and every Ray process it started inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def error_line(stderr: str) -> str:
    """The one line a failed run ends with. Only the progress lines of a slow actor start (one every 10 s while
    actors make their envs, more likely on a busy machine) may come before it."""
    *progress, line = stderr.strip().splitlines()
    assert all(p.startswith("waiting for actors to be placed and start") for p in progress), stderr
    assert "Traceback" not in stderr, stderr
    return line

