"""Recurrent policies end to end on a real Ray: an LSTM and a feed-forward policy train on a memory task (that only
the LSTM solves it is `python -m benchmarks learning-checks`); an LSTM trains with several actors and learners,
resumes from its checkpoint, evaluates and exports with its state as an input and an output; image observations work
too; configs it cannot run are one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from runs import progress_records

CUE = ["--env", "dppo/CueCorridor-v0", "--segment-length", "32", "--seed", "1", "--no-tensorboard", "--set",
       "ppo.minibatch_size=128", "--set", "ppo.learning_rate=0.001"]
# 512-step rounds; the runs whose subject is not several actors take one actor of 16 envs (an actor's start-up less)
TWO_ACTORS = ["--actors", "2", "--envs-per-actor", "8"]
ONE_ACTOR = ["--actors", "1", "--envs-per-actor", "16"]
LSTM = ["--set", "model.recurrent=lstm", "--set", "model.lstm_hidden_size=32"]


def dppo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dppo", *args], capture_output=True, text=True, timeout=timeout)


def last_return(run: Path) -> float:
    return progress_records(run)[-1]["episode_return_mean"]


def test_the_cue_corridor_trains_with_an_lstm_and_with_a_feed_forward_policy(ray_address: str, tmp_path: Path) -> None:
    """Both policies through the whole run, two iterations each; that the LSTM solves the corridor and the
    feed-forward policy does not is a benchmark (`python -m benchmarks learning-checks --only cue-corridor-lstm,
    cue-corridor-feed-forward`)."""
    for name, extra in (("lstm", LSTM), ("feed-forward", [])):
        run = tmp_path / name
        done = dppo("train", *CUE, *ONE_ACTOR, *extra, "--total-steps", "1024", "--address", ray_address,
                    "--run-dir", str(run))
        assert done.returncode == 0, done.stderr
        assert -1.0 <= last_return(run) <= 1.0


def test_an_lstm_trains_with_two_learners_resumes_evaluates_and_exports(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    common = [*CUE, *TWO_ACTORS, *LSTM, "--set", "run.learners=2", "--address", ray_address, "--run-dir", str(run)]
    assert (done := dppo("train", *common, "--total-steps", "2048")).returncode == 0, done.stderr
    resumed = dppo("train", *common, "--total-steps", "4096", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    steps = [r["env_steps"] for r in progress_records(run)]
    assert steps == list(range(512, 4097, 512))  # resumed where it stopped, nothing counted twice
    evaluated = dppo("eval", "--checkpoint", str(run), "--episodes", "4")
    assert evaluated.returncode == 0 and "mean return" in evaluated.stdout, evaluated.stderr
    onnx, script = tmp_path / "policy.onnx", tmp_path / "policy.pt"
    for path in (onnx, script):
        exported = dppo("export", "--checkpoint", str(run), "-o", str(path))
        assert exported.returncode == 0 and "inputs obs, state.h, state.c; outputs action, next_state.h, " \
               "next_state.c" in exported.stdout, exported.stderr
    session, traced = ort.InferenceSession(str(onnx)), torch.jit.load(str(script))
    obs = np.array([[1, 0, 0], [-1, 0, 0]], np.float32)  # the cue, then the corridor's empty observations
    h = c = np.zeros((2, 32), np.float32)
    th, tc = torch.zeros(2, 32), torch.zeros(2, 32)
    for t in range(6):
        action, h, c = session.run(None, {"obs": obs, "state.h": h, "state.c": c})
        t_action, th, tc = traced(torch.as_tensor(obs), th, tc)
        np.testing.assert_array_equal(action, t_action.numpy())
        np.testing.assert_allclose(h, th.numpy(), atol=1e-5)
        obs = np.array([[0, t == 4, (t + 1) / 5]] * 2, np.float32)


def test_an_lstm_on_image_observations_trains(ray_address: str, tmp_path: Path) -> None:
    done = dppo("train", "--env", "minigrid:MiniGrid-Empty-5x5-v0", "--set", "env.wrappers=[{name: "
                "FilterObservation, kwargs: {filter_keys: [image, direction]}}]", *LSTM, "--total-steps", "2048",
                "--actors", "1", "--envs-per-actor", "16",  # one 2048-step round, as the default 2 actors x 8 envs
                "--address", ray_address, "--run-dir", str(tmp_path / "run"), "--no-tensorboard")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "checkpoints").is_dir()


@pytest.mark.parametrize("args, words", [
    (["--set", "ppo.minibatch_size=100"], "ppo.minibatch_size 100 is not a whole number of env columns"),
    (["--env", "minigrid:MiniGrid-Empty-5x5-v0"], "obs['mission']: MissionSpace cannot be encoded"),
])
def test_what_an_lstm_cannot_run_is_one_line_and_exit_2(args: list[str], words: str, tmp_path: Path) -> None:
    done = dppo("train", *CUE, *TWO_ACTORS, *LSTM, *args, "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()
