"""`dppo tune` for real on the session's cluster: by default the settings keep the config's batch and nothing is
written to the working directory (the config file goes to the cache dir); with --change-batch the finalists train
to the config's target return, each a `dppo train` run, and the soonest there is the answer, not the fastest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dppo.config import load_config

# A batch of 64: 2 actors x 2 envs x T 16, minibatches of 32.
SMALL = ["--set", "run.actors=2", "--set", "env.num_envs=2", "--set", "ppo.segment_length=16", "--set",
         "ppo.minibatch_size=32"]


def tune(args: list[str], cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dppo", "tune", "--env", "CartPole-v1", *args],
                          env={**os.environ, "DPPO_TUNE_DIR": str(cache)}, capture_output=True, text=True,
                          timeout=400, cwd=cwd)


def test_by_default_every_setting_keeps_the_batch_and_the_file_goes_to_the_cache(ray_address: str,
                                                                                 tmp_path: Path) -> None:
    work, cache, rows_file = tmp_path / "work", tmp_path / "cache", tmp_path / "rows.json"
    work.mkdir()
    done = tune(["--actors", "1,2", "--placements", "actor", "--full-grid", "1", "--address", ray_address,
                 "--no-save", "--json", str(rows_file), *SMALL], cache, work)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(rows_file.read_text())
    assert {r["candidate"] for r in rows} == {"1x4 T16 actor", "2x2 T16 actor"} and {r["batch"] for r in rows} == {64}
    assert list(work.iterdir()) == []  # nothing in the working directory
    chosen = load_config(cache / "tune-CartPole-v1.yaml")
    assert (chosen.batch_size, chosen.minibatch_size) == (64, 32)
    assert f"dppo train --config {cache / 'tune-CartPole-v1.yaml'}" in done.stdout


@pytest.mark.slow  # two tune measurements and two dppo train runs to the target
def test_change_batch_answers_the_soonest_to_the_target_return(ray_address: str, tmp_path: Path) -> None:
    cache, rows_file = tmp_path / "cache", tmp_path / "rows.json"
    done = tune(["--actors", "1", "--envs-per-actor", "2,4", "--placements", "actor", "--full-grid", "1",
                 "--change-batch", "--finalists", "2", "--score-minutes", "1", "--address", ray_address, "--no-save",
                 "--json", str(rows_file), *SMALL, "--set", "run.target_return=25"], cache, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["candidate"]: r for r in json.loads(rows_file.read_text())}
    assert set(rows) == {"1x2 T16 actor", "1x4 T16 actor"}  # batches of 32 and 64
    reached = {name: r["to_target_s"] for name, r in rows.items() if r["to_target_s"] is not None}
    assert reached, rows
    answer = min(reached, key=reached.get)
    assert f"soonest to the target return 25: {answer}, in {reached[answer]:.1f} s of training" in done.stdout
    runs = sorted((cache / "tune-CartPole-v1.runs").glob("run-*/summary.json"))
    assert len(runs) == 2  # each a dppo train run, in the cache dir
    chosen = load_config(cache / "tune-CartPole-v1.yaml")
    assert f"{chosen.run.actors}x{chosen.env.num_envs} T{chosen.ppo.segment_length} actor" == answer
