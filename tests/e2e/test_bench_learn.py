"""`python -m benchmarks learn`: real training and evaluation subprocesses, the table and figure it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from runs import processes_with, run_benchmark, wait_until

from dppo.bench.runs import stop_process_tree


@pytest.mark.slow
def test_learn_table_trains_evaluates_and_plots_every_seed(tmp_path: Path, ray_address: str) -> None:
    docs = tmp_path / "docs" / "benchmarks.md"
    rows_file = tmp_path / "rows.json"
    done = run_benchmark("learn", "--env", "CartPole-v1", "--seeds", "1,2", "--total-steps", "2048", "--episodes", "2",
                         "--parallel", "2", "--out-dir", str(tmp_path / "runs"), "--write-docs", str(docs),
                         "--json", str(rows_file), "--set", "run.actors=1", "--address", ray_address, timeout=600)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(rows_file.read_text())
    assert row["env"] == "CartPole-v1" and row["seeds"] == 2 and row["env_steps"] >= 2048
    per_seed = row["per_seed"]
    assert [r["seed"] for r in per_seed] == [1, 2]
    for run in per_seed:  # the eval is the run's own `dppo eval`, the train figure its summary
        summary = json.loads((Path(run["run_dir"]) / "summary.json").read_text())
        assert summary["episode_return_mean"] == run["episode_return_mean"] and summary["reason"] == "total_steps"
        assert 8 <= run["eval_return"] <= 500
    values = [r["eval_return"] for r in per_seed]
    assert row["eval_return"]["mean"] == pytest.approx(sum(values) / 2, abs=0.06)
    text = docs.read_text()
    assert "<!-- dppo-bench:learn-CartPole-v1:begin -->" in text and "| CartPole-v1 | 2 |" in text
    assert (docs.parent / "bench-learn-CartPole-v1.png").stat().st_size > 10_000


def test_learn_rejects_an_unknown_env(tmp_path: Path) -> None:
    done = run_benchmark("learn", "--env", "NoSuchEnv-v0", cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "NoSuchEnv-v0" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_run_past_its_timeout_is_stopped_with_its_whole_process_tree(tmp_path: Path) -> None:
    """What bench learn and bench solve do at --timeout: SIGTERM (the learner checkpoints), then SIGKILL to
    every process the run started (a bare SIGKILL of the run leaves its local Ray's agents running)."""
    marker = f"DPPO_TEST_RUN={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | dict([marker.split("=")])
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "dppo", "train", "--run-dir", str(run_dir), "--total-steps",
                             "10000000", "--set", "run.target_return=null"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (run_dir / "progress.jsonl").exists(), proc, "the run's first iteration", timeout=180)
        assert len(processes_with(marker)) > 3  # the learner, its local Ray (GCS, raylet, agents) and the actors
    finally:
        stop_process_tree(proc)
    assert proc.returncode == 143  # dppo train's exit after a signal, with its final checkpoint
    assert json.loads((run_dir / "summary.json").read_text())["reason"] == "signal"
    deadline = time.monotonic() + 3
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []


@pytest.mark.slow
def test_variants_table_compares_a_mask_on_and_off(tmp_path: Path, ray_address: str) -> None:
    rows_file = tmp_path / "rows.json"
    done = run_benchmark("variants", "--env", "dppo/MaskedGrid-v0", "--variant", "mask",
                         "--variant", "no-mask:model.action_mask_key=null", "--seeds", "1", "--total-steps", "2048",
                         "--episodes", "2", "--solved-at", "-5", "--out-dir", str(tmp_path / "runs"),
                         "--json", str(rows_file), "--set", "run.actors=1", "--address", ray_address, timeout=600)
    assert done.returncode == 0, done.stderr
    mask, no_mask = json.loads(rows_file.read_text())
    assert (mask["variant"], no_mask["variant"], no_mask["overrides"]) == ("mask", "no-mask",
                                                                         "model.action_mask_key=null")
    for row in (mask, no_mask):  # every return reaches -5: solved at the first iteration, 1024 env steps
        assert row["solved"] == "1/1" and row["steps_to_solve"] == 1024 and row["actor_us_per_step"] > 0
        config = (Path(row["per_seed"][0]["run_dir"]) / "config.yaml").read_text()
        assert ("action_mask_key: null" in config) == (row is no_mask)
    assert (tmp_path / "runs" / "variants-dppo_MaskedGrid-v0.png").stat().st_size > 10_000


def test_variants_rejects_a_malformed_variant(tmp_path: Path) -> None:
    done = run_benchmark("variants", "--env", "CartPole-v1", "--variant", "lstm:model.recurrent", cwd=tmp_path,
                         timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "NAME:KEY=VALUE" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_sweep_bench_times_a_one_trial_sweep_against_dppo_train(tmp_path: Path, ray_address: str) -> None:
    """`python -m benchmarks sweep --compare train`: the same config through Tune and through `dppo train`, both
    trained to the same steps, evaluated, and written as a docs section."""
    import yaml

    sweep_file, rows_file, docs = tmp_path / "one.yaml", tmp_path / "rows.json", tmp_path / "benchmarks.md"
    sweep_file.write_text(yaml.safe_dump({
        "base": {"env": "CartPole-v1"}, "space": {}, "trials": 1, "concurrent": 1, "driver_cpus": 1,
        "set": {"run.total_steps": 2048, "run.actors": 1, "run.actor_cpus": 0.5, "run.tensorboard": False,
                "run.seed": 4}}))
    done = run_benchmark("sweep", "--config", str(sweep_file), "--compare", "train", "--episodes", "2",
                         "--out-dir", str(tmp_path / "runs"), "--json", str(rows_file), "--write-docs", str(docs),
                         timeout=600, ray_address=ray_address)
    assert done.returncode == 0, done.stderr
    swept, trained = json.loads(rows_file.read_text())
    assert (swept["runs"], trained["runs"]) == ("dppo sweep, 1 trial", "dppo train")
    for row in (swept, trained):
        assert row["env_steps"] == 2048 and row["steps_per_s"] > 0 and row["wall_s"] >= row["train_s"] > 0
        (run,) = row["per_run"]
        assert yaml.safe_load((Path(run["run_dir"]) / "config.yaml").read_text())["run"]["seed"] == 4
    assert "## Sweep (train), CartPole-v1" in docs.read_text()
    assert (tmp_path / "bench-sweep-train-CartPole-v1.png").stat().st_size > 10_000


def test_sweep_bench_refuses_a_bad_sweep_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("base: {env: CartPole-v1}\nspace: {ppo.epochs: 'uniform(0.1, 0.2)'}\n")
    done = run_benchmark("sweep", "--config", "bad.yaml", "--compare", "train", cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "sweep space ppo.epochs" in done.stderr
    assert not (tmp_path / "runs").exists()
