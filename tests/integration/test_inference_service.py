"""The inference service on real Ray: served greedy actions equal the in-actor ones (MLP and CNN), replies carry
the version asked for with two versions live, a seeded run through the service reproduces itself and the in-actor
run, and a service killed mid-run is replaced while the run finishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest
import ray
import torch

import dppo.envs  # noqa: F401 - registers the toy envs
from dppo.config import load_config
from dppo.distributed.inference import ServiceClient, start_service
from dppo.rl.agent import Agent, export_weights
from dppo.rl.build import build_model
from dppo.rl.policy import RemotePolicy, Request


def weights_of(env: gym.Env, config, seed: int) -> dict:
    torch.manual_seed(seed)
    return export_weights(build_model(env.observation_space, env.action_space, config.model))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "dppo/DictMatch-v0"])
def test_served_greedy_actions_are_the_in_actor_ones(ray_address: str, env_id: str) -> None:
    config = load_config(overrides={"env.id": env_id, "ppo.minibatch_size": 32})
    env = gym.make(env_id)
    weights = weights_of(env, config, seed=4)
    service = start_service(config, env.observation_space, env.action_space, "cpu")
    try:
        ray.get(service.load.remote(weights, 3))
        local = Agent(env.observation_space, env.action_space, config.model, seed=0)
        local.load(weights, 3)
        remote = RemotePolicy(env.observation_space, env.action_space, config.model, seed=0, num_envs=16)
        remote.client, remote.version = ServiceClient(service), 3
        obs = local.obs_spec.encode_many([env.reset(seed=i)[0] for i in range(16)])
        actions, _, values = remote.act(obs, greedy=True)
        want_actions, _, want_values = local.act(obs, greedy=True)
        np.testing.assert_array_equal(actions, want_actions)
        np.testing.assert_allclose(values, want_values, atol=1e-6)
    finally:
        ray.kill(service)


def test_replies_carry_the_version_asked_for_with_two_live(ray_address: str) -> None:
    config = load_config(overrides={"run.actors": 3, "ppo.minibatch_size": 32})
    env = gym.make("CartPole-v1")
    versions = {v: weights_of(env, config, seed=v) for v in (1, 2, 3)}
    service = start_service(config, env.observation_space, env.action_space, "cpu")
    try:
        for version in (1, 2):
            ray.get(service.load.remote(versions[version], version))
        spec = Agent(env.observation_space, env.action_space, config.model, seed=0).obs_spec
        obs = spec.encode(np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))
        asked = [1, 2, 1]  # as many as run.actors: one batch, two versions in it
        replies = ray.get([service.act.remote(Request(v, obs)) for v in asked])
        assert [r.version for r in replies] == asked
        for version, reply in zip(asked, replies, strict=True):
            agent = Agent(env.observation_space, env.action_space, config.model, seed=0)
            agent.load(versions[version], version)
            np.testing.assert_array_equal(reply.heads.values, agent.value(obs))
        assert not np.array_equal(replies[0].heads.values, replies[1].heads.values)
        assert ray.get(service.load.remote(versions[3], 3)) == [2, 3]  # the oldest goes
        with pytest.raises(ray.exceptions.RayTaskError, match="version 1 is not held"):
            ray.get(service.act.remote(Request(1, obs)))
    finally:
        ray.kill(service)


def train(ray_address: str, run_dir: Path, *args: str, total_steps: int = 2048) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", str(run_dir),
           "--actors", "2", "--envs-per-actor", "4", "--segment-length", "64", "--total-steps", str(total_steps),
           "--seed", "3", "--set", "run.tensorboard=false", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def progress(run_dir: Path) -> list[dict]:
    """Each iteration's record without its timings."""
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k.endswith("_s") or "per_s" in k or "seconds" in k)} for r in records]


@pytest.mark.slow
def test_a_seeded_served_run_reproduces_itself_and_the_in_actor_run(ray_address: str, tmp_path: Path) -> None:
    runs = {}
    for name, inference in (("served", "server"), ("again", "server"), ("actor", "actor")):
        done = train(ray_address, tmp_path / name, "--set", f"run.inference={inference}",
                     "--set", "run.overlap_sampling=true")  # two versions live in the service
        assert done.returncode == 0, done.stderr
        runs[name] = progress(tmp_path / name)
    assert len(runs["served"]) == 4 and runs["served"][-1]["policy_lag"] == 1
    assert runs["served"] == runs["again"] == runs["actor"]


def inference_service_pids() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if " ".join(p.info["cmdline"] or []).startswith("ray::InferenceService")]


@pytest.mark.slow
def test_a_service_killed_mid_run_is_replaced_and_the_run_finishes(ray_address: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", str(run_dir), "--actors", "2",
           "--envs-per-actor", "4", "--segment-length", "64", "--total-steps", "10000", "--seed", "3",
           "--set", "run.inference=server", "--set", "run.tensorboard=false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "progress.jsonl").exists() or len(progress(run_dir)) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        pids = inference_service_pids()
        assert len(pids) == 1
        os.kill(pids[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert "the inference service was lost" in out + err and "loss 1" in out + err
    assert progress(run_dir)[-1]["env_steps"] >= 10000
    assert json.loads((run_dir / "summary.json").read_text())["reason"] == "total_steps"
