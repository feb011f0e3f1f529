"""The real CLI end to end on a real Ray cluster (the session's, joined with --address)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from runs import progress_records, without_timings

PROGRESS_KEYS = {"iteration", "env_steps", "wall_s", "episodes", "episode_return_mean", "episode_length_mean",
                 "steps_per_s", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
                 "explained_variance", "learning_rate", "grad_norm", "policy_version", "sample_s", "wait_s",
                 "update_s", "sync_s", "env_s", "inference_s"}
SUMMARY_KEYS = {"solved", "reason", "wall_s", "env_steps", "iterations", "episode_return_mean", "target_return"}


def train(
    dppo_cmd: list[str], address: str, run_dir: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess:
    cmd = [*dppo_cmd, "train", "--address", address, "--run-dir", str(run_dir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_cartpole_two_actors_runs_to_its_budget_records_and_evaluates(
        dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    """The whole run, four iterations: its summary, records, config and checkpoint, then `dppo eval`. That it solves
    CartPole within 300k steps is a benchmark (`python -m benchmarks learning-checks --only cartpole-two-actors`)."""
    run_dir = tmp_path / "run"
    done = train(dppo_cmd, ray_address, run_dir, "--actors", "2", "--seed", "1", "--total-steps", "4096")
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_KEYS
    assert summary["solved"] is False and summary["reason"] == "total_steps" and summary["target_return"] == 475
    assert summary["env_steps"] == 4096
    assert "stopped (total_steps)" in done.stdout
    records = progress_records(run_dir)
    assert all(r.keys() >= PROGRESS_KEYS for r in records)
    assert [r["iteration"] for r in records] == list(range(1, len(records) + 1))
    assert records[-1]["env_steps"] == summary["env_steps"]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["run"]["actors"] == 2 and config["env"]["id"] == "CartPole-v1"
    assert (run_dir / "checkpoints" / "latest").read_text().strip().startswith("ckpt-")

    evaluated = subprocess.run([*dppo_cmd, "eval", "--checkpoint", str(run_dir), "--episodes", "3"],
                               capture_output=True, text=True, timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr
    mean = float(evaluated.stdout.split("mean return ")[1].split()[0])
    assert 8 <= mean <= 500, evaluated.stdout  # CartPole's shortest and longest episodes


def test_resume_continues_counters(dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = train(dppo_cmd, ray_address, run_dir, "--total-steps", "3000", "--set", "run.checkpoint_every=1",
                  "--actors", "1", "--envs-per-actor", "16")  # the preset's 1024-step rounds, one actor to start
    assert first.returncode == 0, first.stderr
    before = progress_records(run_dir)
    second = train(dppo_cmd, ray_address, run_dir, "--resume", "--total-steps", "6000")
    assert second.returncode == 0, second.stderr
    assert "resuming" in second.stderr
    after = progress_records(run_dir)
    assert after[: len(before)] == before
    iterations = [r["iteration"] for r in after]
    steps = [r["env_steps"] for r in after]
    assert iterations == list(range(1, len(after) + 1))
    assert steps == sorted(steps) and steps[-1] >= 6000 > steps[len(before) - 1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == steps[-1] and summary["reason"] == "total_steps"


def test_seeded_runs_are_reproducible(dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        done = train(dppo_cmd, ray_address, tmp_path / name, "--total-steps", "4000", "--seed", "7")
        assert done.returncode == 0, done.stderr
        runs.append(without_timings(progress_records(tmp_path / name)))
    assert runs[0] == runs[1]
    assert len(runs[0]) >= 3


def test_overlap_sampling_runs_one_version_behind(dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = train(dppo_cmd, ray_address, run_dir, "--total-steps", "6000", "--set", "run.overlap_sampling=true")
    assert done.returncode == 0, done.stderr
    records = progress_records(run_dir)
    assert records[0]["policy_lag"] == 0  # the first round samples with the initial weights
    assert all(r["policy_lag"] == 1 for r in records[1:])
    assert records[-1]["env_steps"] >= 6000
    # round k + 1 is sampled during update k with the weights before it: every iteration trains on exactly one
    # segment per actor, each used once (the round sampling when the run stops is never trained on or counted)
    per_segment = 8 * 64  # the CartPole preset: E = 8, T = 64
    assert all(r["segments"] == 2 and r["env_steps_delta"] == 2 * per_segment for r in records)
    assert records[-1]["env_steps"] == len(records) * 2 * per_segment
    assert [r["policy_version"] for r in records] == list(range(1, len(records) + 1))
    again = train(dppo_cmd, ray_address, tmp_path / "again", "--total-steps", "6000", "--set",
                  "run.overlap_sampling=true")
    assert again.returncode == 0, again.stderr
    assert without_timings(progress_records(tmp_path / "again")) == without_timings(records)  # seeded: the same run
