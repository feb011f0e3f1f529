"""dppo and Ray clusters: a local run (no --address) starts Ray beside the learner and leaves no process behind;
a cluster with Ray's token authentication is joined with the token where Ray documents it, and refused in one
line without it."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from runs import processes_with

from dppo.bench.local_cluster import LocalCluster


def test_a_local_run_starts_ray_beside_the_learner_and_leaves_no_process(dppo_cmd: list[str], tmp_path: Path) -> None:
    marker = f"DPPO_TEST_RUN={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | dict([marker.split("=")])
    run_dir = tmp_path / "run"
    done = subprocess.run([*dppo_cmd, "train", "--run-dir", str(run_dir), "--total-steps", "2048",
                           "--set", "run.target_return=null"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    phases = json.loads((run_dir / "summary.json").read_text())["startup_s"]
    assert list(phases) == ["launch", "config", "ray_init", "learner", "actors_ready"]
    deadline = time.monotonic() + 3  # SIGKILL lands at once; left alone, Ray's agents outlive the run by seconds
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []


@pytest.fixture(scope="module")
def token_cluster() -> Iterator[tuple[str, str]]:
    """A Ray head with token authentication on, as `ray start --head` makes it by default (its own ports and temp
    dir, 2 CPUs for the actors); yields its GCS address and its token."""
    token = secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"RAY_AUTH_MODE": "token",
                                                                                "RAY_AUTH_TOKEN": token}
    cluster = LocalCluster(env)
    try:
        yield cluster.start_head(cpus=2), token
    finally:
        cluster.stop()


def client(dppo_cmd: list[str], address: str, home: Path, run_dir: Path, **env: str) -> subprocess.CompletedProcess:
    """`dppo train` against ``address`` from a user whose HOME is ``home``, with no Ray variable but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"HOME": str(home)} | env
    return subprocess.run([*dppo_cmd, "train", "--address", address, "--run-dir", str(run_dir), "--total-steps",
                           "2048", "--no-tensorboard"], env=clean, capture_output=True, text=True, timeout=300)


def test_joining_a_token_cluster_without_its_token_is_one_line_exit_2(
        dppo_cmd: list[str], token_cluster: tuple[str, str], tmp_path: Path) -> None:
    address, _token = token_cluster
    done = client(dppo_cmd, address, tmp_path, tmp_path / "run")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr  # Ray's own warnings do not reach the user
    assert f"the Ray cluster at {address} requires a token" in done.stderr
    assert "RAY_AUTH_TOKEN" in done.stderr and "~/.ray/auth_token" in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_wrong_token_is_refused_in_one_line(dppo_cmd: list[str], token_cluster: tuple[str, str],
                                              tmp_path: Path) -> None:
    address, _token = token_cluster
    done = client(dppo_cmd, address, tmp_path, tmp_path / "run", RAY_AUTH_TOKEN="0" * 32)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "refused the token" in done.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["environment", "file"])
def test_the_token_where_ray_documents_it_joins_the_cluster(dppo_cmd: list[str], token_cluster: tuple[str, str],
                                                            tmp_path: Path, where: str) -> None:
    """RAY_AUTH_TOKEN, or ~/.ray/auth_token, without RAY_AUTH_MODE: dppo turns Ray's token mode on itself."""
    address, token = token_cluster
    env = {"RAY_AUTH_TOKEN": token} if where == "environment" else {}
    if where == "file":
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text(token)
    done = client(dppo_cmd, address, tmp_path, tmp_path / "run", **env)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] == 2048
