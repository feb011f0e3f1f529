"""dppo.train and dppo.load on the session's cluster (dppo/api.py): the docs' example as written (a shorter budget),
a run in this process stopped by its callback, a callback of run.callbacks that fails a `dppo train` run, and Ctrl-C
on a script that trains."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from runs import REPO, error_line, progress_records, run_workers

import dppo

PAGE = (REPO / "docs" / "python-api.md").read_text()
SMALL = {"run.checkpoint_every": 1, "run.tensorboard": False}


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE, re.S)


def test_the_docs_example_trains_loads_and_acts_as_written(tmp_path: Path, ray_address: str) -> None:
    """The page's first example, then its vector-env one, as a user's script (joining the cluster by RAY_ADDRESS):
    only the budget is cut to two iterations."""
    first, vector = python_blocks()[0], next(b for b in python_blocks() if "make_vec" in b)
    assert "total_steps=150_000" in first
    script = first.replace("total_steps=150_000", "total_steps=2_048") + vector
    (tmp_path / "example.py").write_text(script)
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_ADDRESS": ray_address})
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / "runs" / "cartpole-py"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "total_steps" and summary["env_steps"] == 2048
    lines = done.stdout.splitlines()
    assert f"total_steps {summary['episode_return_mean']} runs/cartpole-py/checkpoints/ckpt-00000002.pt" in lines
    assert any(re.fullmatch(r"return \d+\.0", line) for line in lines), done.stdout
    assert f"joining Ray at {ray_address}" in done.stdout


def test_a_run_in_this_process_stops_by_its_callback_and_its_policy_acts(tmp_path: Path, ray_address: str,
                                                                          keep_signal_handlers: None) -> None:
    """This process's Ray (the session's) is used; a callback sees each iteration and stops the run at the second:
    the reason in summary.json and the result, a final checkpoint, the progress rows; the loaded policy acts in a
    plain gymnasium loop on one observation and on a batch."""
    seen: list[tuple[int, bool]] = []

    def stop_at_two(info: dppo.IterationInfo) -> None:
        seen.append((info.iteration, info.run_dir == tmp_path / "run"))
        if info.iteration == 2:
            raise dppo.StopRun("two iterations seen")

    handler = signal.getsignal(signal.SIGINT)
    result = dppo.train(env="CartPole-v1", actors=1, envs_per_actor=8, segment_length=64, total_steps=1_000_000,
                        seed=3, run_dir=tmp_path / "run", log_format="none", overrides=SMALL, callbacks=[stop_at_two])
    assert signal.getsignal(signal.SIGINT) is handler  # the run's handlers are gone with it
    assert seen == [(1, True), (2, True)]
    assert result.reason == "two iterations seen" and not result.solved
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == result.summary
    assert result.summary["reason"] == "two iterations seen" and result.summary["iterations"] == 2
    assert result.progress == progress_records(tmp_path / "run") and [r["iteration"] for r in result.progress] == [1, 2]
    assert result.last_checkpoint == tmp_path / "run" / "checkpoints" / "ckpt-00000002.pt"
    assert result.best_checkpoint is None  # no run.eval_every
    import ray

    assert ray.is_initialized()  # this process's Ray is left as it was
    policy = dppo.load(result.run_dir)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        action = policy.act(obs)
        assert env.action_space.contains(action)
        obs, _, terminated, truncated, _ = env.step(action)
        assert not (terminated or truncated)
    batch = policy.act(np.stack([obs, obs * 0.5, obs * -1.0]))
    assert batch.shape == (3,) and batch[0] == policy.act(obs)


CALLBACKS = '''
def broken(info):
    if info.iteration == 2:
        raise ValueError(f"no figure at {info.env_steps} env steps")
'''


def test_a_failing_callback_of_run_callbacks_fails_the_run_in_one_line(tmp_path: Path, ray_address: str) -> None:
    """`dppo train` with run.callbacks: the module beside the run is found; its error ends the run after a
    checkpoint, exit 1, one line naming the callback (the traceback in train.log)."""
    (tmp_path / "mycallbacks.py").write_text(textwrap.dedent(CALLBACKS))
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", "run",
                           "--actors", "1", "--envs-per-actor", "8", "--segment-length", "64", "--total-steps", "1e6",
                           "--no-tensorboard", "--set", "run.callbacks=mycallbacks:broken"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr) == ("dppo: run failed: callback mycallbacks:broken raised ValueError: no figure at "
                                       "1024 env steps; the whole traceback is in run/train.log")
    assert json.loads((run_dir / "summary.json").read_text())["reason"] == "error"
    assert (run_dir / "checkpoints" / "ckpt-00000002.pt").is_file()
    assert 'raise ValueError(f"no figure at' in (run_dir / "train.log").read_text()


SCRIPT = '''
import sys
import dppo

try:
    dppo.train(address=sys.argv[1], run_dir=sys.argv[2], actors=1, total_steps=10_000_000, log_format="none",
               overrides={"run.tensorboard": False, "run.checkpoint_every": 1000})
except KeyboardInterrupt as stop:
    print("interrupted:", stop.result.reason, stop.result.last_checkpoint.name, flush=True)
    raise
'''


def test_ctrl_c_ends_the_run_with_a_checkpoint_and_raises_keyboard_interrupt(tmp_path: Path, ray_address: str) -> None:
    """SIGINT to a script in dppo.train: the round ends, a final checkpoint, summary reason signal, then a
    KeyboardInterrupt holding the result (uncaught, it ends the script by SIGINT as Ctrl-C does: 130 in a shell), and
    none of its Ray workers outlives it."""
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", ray_address, str(run_dir)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        progress, deadline = run_dir / "progress.jsonl", time.monotonic() + 180
        while not (progress.exists() and len(progress.read_text().splitlines()) >= 2):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no two iterations"
            time.sleep(0.05)
        assert run_workers(proc.pid, "ray::Actor")
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGINT, err  # an uncaught KeyboardInterrupt: Python ends by SIGINT
    assert "KeyboardInterrupt: the run was stopped by SIGINT after" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "signal"
    last = progress_records(run_dir)[-1]["iteration"]
    assert summary["iterations"] == last >= 2
    assert f"interrupted: signal ckpt-{last:08d}.pt" in out
    deadline = time.monotonic() + 30  # the job's workers go once Ray sees its driver gone
    while run_workers(proc.pid, "ray::"):
        assert time.monotonic() < deadline, [w.info["cmdline"] for w in run_workers(proc.pid, "ray::")]
        time.sleep(0.2)
