"""A process that hangs is a fault like a crash (issue 62): a sampling actor and the evaluation actor, the inference
service, or one learner of two stopped with SIGSTOP and never resumed; the run says so within its deadline
(faults.hang_timeout_s, set low here), kills and replaces the process, finishes with exit 0 and counts the hang in
progress.jsonl and summary.json; nothing stopped is left behind. Real processes, real signals, the session's
cluster (the victims found by the run's job: runs.run_workers, never another test's)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from runs import progress_records, run_workers

# faults.hang_timeout_s: well above a segment of these small runs on a loaded machine, well under a test's patience.
# 6 s was not: a clean-clone CI at high load had every served actor's 64-step segment take longer, 11 times over.
TIMEOUT_S = 15


def gone(proc: psutil.Process, within_s: float = 30.0) -> bool:
    """The process has exited (a zombie awaiting its parent counts) within ``within_s``."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize(("titles", "iterations", "sets"), [
    # the evaluation actor starts at the first evaluation and takes seconds to: a run long enough to stop it
    (["Actor", "Evaluator"], 30, ["run.eval_every=1", "run.eval_episodes=2", "faults.actor_start_timeout_s=10"]),
    # and 14 iterations after the 2nd, by which the victim is stopped: a fast machine does some while it is found
    (["InferenceService"], 16, ["run.inference=server"]),
    (["Learner"], 16, ["run.learners=2", "ppo.minibatch_size=256"]),
], ids=["actor-and-evaluation", "inference-service", "learner"])
def test_a_stopped_process_is_said_hung_replaced_and_the_run_finishes(ray_address: str, tmp_path: Path,
                                                                      titles: list[str], iterations: int,
                                                                      sets: list[str]) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", str(run_dir), "--actors", "2",
           "--envs-per-actor", "4", "--segment-length", "64", "--total-steps", str(512 * iterations), "--seed", "3",
           "--set", "run.tensorboard=false", "--set", "run.target_return=null",
           "--set", f"faults.hang_timeout_s={TIMEOUT_S}", *(arg for item in sets for arg in ("--set", item))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stopped: list[psutil.Process] = []
    try:
        end, waiting = time.monotonic() + 180, list(titles)
        # each victim stopped once the run is two iterations in and its process is up; the evaluation actor once an
        # evaluation came back: stopped while it starts, Ray gave it up (ActorUnavailableError, 20 s after the stop in
        # the run that showed it) before its deadline and start time ran out, a loss (said as one: tests/unit/
        # test_evaluation_end.py), not a hang
        while waiting:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, "the run made no progress"
            records = progress_records(run_dir)
            for title in list(waiting) if len(records) >= 2 else []:
                if title == "Evaluator" and not any("eval_return_mean" in r for r in records):
                    continue
                for victim in run_workers(proc.pid, f"ray::{title}")[:1]:
                    victim.send_signal(signal.SIGSTOP)
                    stopped.append(victim)
                    waiting.remove(title)
            time.sleep(0.1)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for victim in stopped:  # never leave a stopped process behind, whatever happened
            with contextlib.suppress(psutil.Error):
                victim.kill()
    assert proc.returncode == 0, err
    said = out + err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "total_steps" and summary["hangs"] >= len(titles), said
    assert said.count(" hung: ") >= len(titles) and "faults.hang_timeout_s" in said, said
    # an evaluation's hang can come at the end, after the last record
    assert progress_records(run_dir)[-1]["hangs"] == summary["hangs"] or "eval" in said
    (outcome,) = [line for line in said.splitlines() if line.startswith("stopped (total_steps)")]
    assert f"{summary['hangs']} hang" in outcome  # the outcome line names them
    assert all(gone(victim) for victim in stopped), "a stopped process was left behind"
    print(*[line for line in said.splitlines() if " hung" in line], sep="\n")


STUCK_ENV = '''
import os
import time

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class StuckOnce(CartPoleEnv):
    """CartPole whose 40th step blocks for an hour in the first copy of the run to reach it (a deadlocked simulator)."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker, self.steps = marker, 0

    def step(self, action):
        self.steps += 1
        if self.steps == 40:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                time.sleep(3600)
        return super().step(action)


def make(marker: str) -> gym.Env:
    return gym.wrappers.TimeLimit(StuckOnce(marker), 500)
'''


def test_an_env_step_that_never_returns_is_caught_by_the_actors_deadline(ray_address: str, tmp_path: Path) -> None:
    """The env's own step hangs inside an actor: the actor's segment never comes, so the same deadline says it, and
    the replacement (whose env does not hang) carries the run to its end."""
    (tmp_path / "stuck_env.py").write_text(STUCK_ENV)
    run_dir, marker = tmp_path / "run", tmp_path / "stuck-once"
    done = subprocess.run(
        [sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", str(run_dir), "--actors", "2",
         "--envs-per-actor", "2", "--segment-length", "32", "--total-steps", str(2 * 2 * 32 * 6), "--seed", "3",
         "--set", "run.tensorboard=false", "--set", "ppo.minibatch_size=64", "--set", "env.entry_point=stuck_env:make",
         "--set", f"env.kwargs.marker={marker}", "--set", f"faults.hang_timeout_s={TIMEOUT_S}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert marker.exists() and summary["hangs"] == 1 and summary["actor_crashes"] == 0, done.stdout + done.stderr
    assert " hung: sampling a segment" in done.stderr and summary["reason"] == "total_steps"
