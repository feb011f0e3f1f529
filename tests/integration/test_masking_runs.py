"""Action masking end to end: a masked env trains with several actors and several learners, its checkpoint
evaluates and exports with the mask as an input; a mask that allows no action is named in one line, as bad
input when the env starts that way, as a run failure when it turns up later."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

GRID = ["--env", "dppo/MaskedGrid-v0", "--no-tensorboard"]


def dppo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dppo", *args], capture_output=True, text=True, timeout=timeout)


def test_a_masked_env_trains_with_two_actors_and_two_learners_then_evaluates_and_exports(
        ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dppo("train", *GRID, "--address", ray_address, "--run-dir", str(run), "--actors", "2",
                "--set", "run.learners=2", "--total-steps", "8192")
    assert done.returncode == 0, done.stderr
    evaluated = dppo("eval", "--checkpoint", str(run), "--episodes", "3")
    assert evaluated.returncode == 0 and "mean return" in evaluated.stdout, evaluated.stderr
    onnx = tmp_path / "policy.onnx"
    exported = dppo("export", "--checkpoint", str(run), "-o", str(onnx))
    assert exported.returncode == 0 and "obs.action_mask" in exported.stdout, exported.stderr
    session = ort.InferenceSession(str(onnx))
    positions = np.array([[0, 0], [0, 0], [4, 3]], np.int64)
    masks = np.array([[0, 1, 0, 0], [0, 0, 0, 1], [1, 0, 0, 1]], np.int8)  # only down; only right; up or right
    actions = session.run(None, {"obs.position": positions, "obs.action_mask": masks})[0]
    assert actions[0] == 1 and actions[1] == 3 and actions[2] in (0, 3)  # the mode is never a masked move


def test_a_mask_that_allows_nothing_at_reset_is_bad_input(tmp_path: Path) -> None:
    done = dppo("train", *GRID, "--set", "env.kwargs.empty_mask_at=0", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "env 'dppo/MaskedGrid-v0': the action mask of reset()'s observation (obs['action_mask']) allows no " \
           "action" in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_mask_that_allows_nothing_later_stops_the_run_naming_the_env(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dppo("train", *GRID, "--set", "env.kwargs.empty_mask_at=3", "--address", ray_address, "--run-dir",
                str(run))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    # every actor's env empties its mask at the same step: whichever actor's failure reaches the driver first is named
    assert re.search(r"actor \d+: env dppo/MaskedGrid-v0 returned an action mask that allows no action", done.stderr)
    assert not list((run / "checkpoints").glob("ckpt-*.pt"))  # nothing was trained: no checkpoint of nothing
