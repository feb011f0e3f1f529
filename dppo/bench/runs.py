"""`dppo train` as a timed subprocess: what a user waits for is a whole run, start-up and exit included, so each
run is timed from launch to exit with its process tree's peak memory (`dppo bench score`, and a clone's
benchmarks/); a run that overruns is stopped with its whole process tree."""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from dppo.bench.common import Row
from dppo.bench.memory import PeakMemory
from dppo.errors import UsageError


def stop_process_tree(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """End a run that overran: SIGTERM first (its driver checkpoints and stops its local Ray), then SIGKILL to
    whatever is left of its process tree, found while the run was alive (a bare SIGKILL of the run leaves
    Ray's dashboard and runtime-env agents running)."""
    import psutil

    def tree() -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return psutil.Process(proc.pid).children(recursive=True)
        return []

    seen = {p.pid: p for p in tree()}
    proc.terminate()
    deadline = time.monotonic() + grace_s
    while proc.returncode is None and time.monotonic() < deadline:
        seen.update({p.pid: p for p in tree()})  # processes started since (Ray's agents, if it was starting)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=0.2)  # reads the pipes, so a chatty run cannot block on them
    if proc.returncode is None:
        proc.kill()
        proc.communicate()
    for child in seen.values():
        with contextlib.suppress(psutil.Error):
            child.kill()  # psutil checks the start time: a reused pid is left alone


def timed_subprocess(cmd: list[str], timeout_s: float) -> tuple[float, float, PeakMemory]:
    """Run ``cmd`` to its end: wall seconds from launch to exit, the epoch time it ended, its tree's peak memory."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with PeakMemory(lambda: [proc.pid]) as memory:
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_process_tree(proc)
            raise UsageError(f"`{shlex.join(cmd)}` ran past --timeout {timeout_s:g}s; "
                             "raise --timeout (seconds per run)") from None
    wall, ended_at = time.perf_counter() - start, time.time()
    if proc.returncode != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"`{shlex.join(cmd)}` exited {proc.returncode}: {last}")
    return wall, ended_at, memory


def memory_cells(memory: PeakMemory) -> Row:
    return {"peak_rss_mib": memory.peak["rss_mib"], "peak_pss_mib": memory.peak["pss_mib"],
            "processes": memory.peak["processes"]}


def run_train(argv: list[str], run_dir: Path, timeout_s: float) -> Row:
    """One `dppo train` subprocess: wall time from launch to exit (start-up included) and peak memory."""
    cmd = [sys.executable, "-m", "dppo", "train", *argv, "--run-dir", str(run_dir)]
    wall, ended_at, memory = timed_subprocess(cmd, timeout_s)
    summary = json.loads((run_dir / "summary.json").read_text())
    phases = summary["startup_s"]
    return {"wall_s": round(wall, 2), "train_s": summary["wall_s"], "startup_s": round(sum(phases.values()), 2),
            "phases": phases, "first_iteration_s": summary["first_iteration_s"],
            "exit_s": round(ended_at - summary["finished_at"], 2),
            "env_steps": summary["env_steps"], "iterations": summary["iterations"], "solved": summary["solved"],
            "episode_return_mean": summary["episode_return_mean"], **memory_cells(memory), "run_dir": str(run_dir)}
