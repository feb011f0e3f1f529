"""Several data-parallel learners (torch.distributed gloo through Ray) compute the update of one learner."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import ray
import torch
from conftest import CROWD
from runs import progress_records

from dppo.config import load_config
from dppo.distributed.learner_group import LearnerGroup
from dppo.envs.make import env_spaces
from dppo.rl.model import ActorCritic
from dppo.rl.ppo import Trainer
from dppo.rl.sampler import Sampler


def config(learners: int, **extra: object):
    return load_config(overrides={"run.learners": learners, "env.num_envs": 4, "ppo.segment_length": 64,
                                  "ppo.minibatch_size": 128, "ppo.epochs": 3, "ppo.target_kl": 0.5,
                                  "ppo.learning_rate": 0.003, "run.actors": 2, **extra})


# agents that leave early: their padding steps are masked out of each learner's shard of the losses
CROWD_RUN = {"env.entry_point": "crowd:parallel_env", "env.multiagent": True, "env.num_envs": 2}


@pytest.mark.slow
@pytest.mark.parametrize("env", [{}, CROWD_RUN], ids=["cartpole", "agents-leaving-early"])
def test_two_learners_make_the_same_first_updates_as_one(ray_address: str, env: dict, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "crowd.py").write_text(textwrap.dedent(CROWD))
    monkeypatch.syspath_prepend(str(tmp_path))
    one = config(1, **env)
    obs_space, action_space = env_spaces(one)
    torch.manual_seed(0)
    model = ActorCritic(obs_space, action_space, one.model)
    trainer = Trainer(model, one.ppo, one.num_iterations, one.run.seed, torch.device("cpu"))
    group = LearnerGroup(config(2, **env), obs_space, action_space, model, trainer.state_dict())
    try:
        samplers = [Sampler(one, actor_id=i) for i in range(2)]
        for iteration in range(3):
            weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
            for sampler in samplers:
                sampler.set_weights(weights, iteration)
            segments = [s.sample() for s in samplers]
            assert (segments[0].active is not None) == bool(env)
            expected = trainer.train_on(segments, iteration, iteration + 1)
            got = group.update(segments, [ray.put(s) for s in segments], iteration, iteration + 1)
            for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm"):
                assert getattr(got, key) == pytest.approx(getattr(expected, key), rel=1e-4, abs=1e-6), key
            assert got.epochs_run == expected.epochs_run
            for key, value in group.weights().items():
                torch.testing.assert_close(torch.tensor(value), model.state_dict()[key], rtol=1e-4, atol=1e-5)
    finally:
        group.shutdown()


@pytest.mark.slow
def test_train_with_two_learners_then_resume_with_one(tmp_path: Path, ray_address: str) -> None:
    run_dir = tmp_path / "run"
    base = [sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", str(run_dir),
            "--actors", "1", "--envs-per-actor", "8",  # 512-step rounds from one actor: the learners are the subject
            "--segment-length", "64", "--set", "ppo.minibatch_size=128", "--no-tensorboard"]
    first = subprocess.run([*base, "--total-steps", "1024", "--set", "run.learners=2"], capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([*base, "--resume", "--total-steps", "2048"], capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    records = progress_records(run_dir)
    assert [r["env_steps"] for r in records] == [512, 1024, 1536, 2048]


def test_learners_use_gpus_only_with_one_per_learner(ray_address: str) -> None:
    """NCCL refuses two ranks on one GPU, so cuda needs a GPU per learner; auto falls back to gloo on CPUs."""
    from dppo.distributed.learner_group import group_device
    from dppo.errors import UsageError

    gpus = int(ray.cluster_resources().get("GPU", 0))
    assert group_device(config(2, **{"run.device": "cpu"})) == "cpu"
    assert group_device(config(2, **{"run.device": "auto"})) == ("cuda" if gpus >= 2 else "cpu")
    if gpus < 2:
        with pytest.raises(UsageError, match=rf"needs a GPU per learner, but the Ray cluster has {gpus}"):
            group_device(config(2, **{"run.device": "cuda"}))


def test_cuda_learners_without_gpus_are_bad_input(tmp_path: Path, ray_address: str) -> None:
    """`dppo train --set run.learners=2 --set run.device=cuda` on a cluster without 2 GPUs: exit 2, one line,
    nothing written."""
    gpus = int(ray.cluster_resources().get("GPU", 0))
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", str(run_dir),
                           "--set", "run.learners=2", "--set", "run.device=cuda", "--total-steps", "1024"],
                          capture_output=True, text=True, timeout=300)
    if gpus >= 2:
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"needs a GPU per learner, but the Ray cluster has {gpus}" in done.stderr
    assert not run_dir.exists()


def test_minibatch_must_split_over_the_learners() -> None:
    from dppo.config import ConfigError

    with pytest.raises(ConfigError, match=r"multiple of run\.learners"):
        config(3)


@pytest.mark.slow
def test_bench_learners_rows(ray_address: str) -> None:
    """`dppo bench update --learners 1,2`: one learner with 1 and 2 threads, then 2 learners, same batch."""
    from dppo.bench.learners import bench_learners

    rows = bench_learners([[32]], [1, 2], actors=2, envs_per_actor=2, segment_length=32, minibatch_size=64,
                          iterations=1)
    assert [(r["learners"], r["threads_per_learner"]) for r in rows] == [(1, 1), (1, 2), (2, 1)]
    assert all(r["batch"] == 128 and r["samples_per_s"] > 0 and r["model"] == "MLP [32]" for r in rows)
    assert rows[0]["allreduce_share"] is None and 0 < rows[2]["allreduce_share"] < 1
