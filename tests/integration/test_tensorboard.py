"""TensorBoard event files, read back with tensorboard's own EventAccumulator, against progress.jsonl."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from runs import progress_records
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dppo.run.tensorboard import tag


def train(address: str, run_dir: Path, *args: str) -> None:
    """A short run of 256-step iterations: one actor of 8 envs (an actor's start-up less than two of 4 envs)."""
    done = subprocess.run([sys.executable, "-m", "dppo", "train", "--address", address, "--run-dir", str(run_dir),
                           "--actors", "1", "--envs-per-actor", "8", "--segment-length", "32", "--set",
                           "ppo.minibatch_size=64",
                           "--set", "run.checkpoint_every=1", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def events(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tags_are_grouped_like_cleanrl() -> None:
    assert tag("episode_return_mean") == "charts/episode_return_mean"
    assert tag("policy_loss") == "losses/policy_loss" and tag("approx_kl") == "losses/approx_kl"
    assert tag("update_s") == "time/update_s" and tag("steps_per_s") == "time/steps_per_s"


@pytest.mark.slow
def test_every_progress_scalar_is_logged_at_its_env_steps_across_a_resume(tmp_path: Path, ray_address: str) -> None:
    run_dir = tmp_path / "run"
    train(ray_address, run_dir, "--total-steps", "768")
    # As if the run died after its checkpoint at 512 steps: drop the newest checkpoint, then resume.
    checkpoints = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))
    checkpoints[-1].unlink()
    (run_dir / "checkpoints" / "latest").write_text(checkpoints[-2].name + "\n")
    train(ray_address, run_dir, "--resume", "--total-steps", "1280")
    records = progress_records(run_dir)
    assert [r["env_steps"] for r in records] == [256, 512, 768, 1024, 1280]
    acc = events(run_dir)
    scalars = acc.Tags()["scalars"]
    for key in ("episode_return_mean", "policy_loss", "value_loss", "entropy", "learning_rate", "update_s",
                "steps_per_s", "explained_variance"):
        assert tag(key) in scalars
        points = acc.Scalars(tag(key))
        steps = [p.step for p in points]
        assert steps == sorted(set(steps)), f"{key}: duplicate or unordered steps {steps}"
        expected = {r["env_steps"]: r[key] for r in records if r.get(key) is not None}
        assert steps == sorted(expected)
        for point in points:
            assert point.value == pytest.approx(expected[point.step], rel=1e-5, abs=1e-6)
    config_text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "env:" in config_text and "CartPole-v1" in config_text


@pytest.mark.slow
def test_no_tensorboard_flag_writes_no_event_files(tmp_path: Path, ray_address: str) -> None:
    run_dir = tmp_path / "run"
    train(ray_address, run_dir, "--total-steps", "256", "--no-tensorboard")
    assert (run_dir / "progress.jsonl").exists() and not (run_dir / "tensorboard").exists()
