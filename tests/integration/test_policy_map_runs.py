"""Several policies (a policy map) through the real CLI on a real Ray cluster: MPE's simple_adversary (an adversary
whose observation is smaller than its two opponents') trains with one policy per role, reproduces itself from a
seed, resumes, evaluates while training and from a checkpoint, exports each policy, trains with two learners per
policy; a map that does not fit the env is one line, exit 2. Short runs: they check the pipeline, not learning."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from runs import progress_records as progress
from runs import run_dppo as dppo
from runs import without_timings

MAP = "policies={adversary: ['adversary_*'], agent: ['agent_*']}"
ADVERSARY = ["--env", "mpe2.simple_adversary_v3", "--envs-per-actor", "2", "--segment-length", "25",
             "--no-tensorboard", "--set", "env.kwargs.max_cycles=25", "--set", "ppo.minibatch_size=50", "--set",
             MAP]  # 2 copies x 3 agents: per actor and segment 50 adversary steps, 100 agent steps


def test_a_seeded_run_of_two_policies_reproduces_itself(ray_address: str, tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        done = dppo("train", *ADVERSARY, "--address", ray_address, "--run-dir", str(tmp_path / name), "--actors",
                    "2", "--seed", "3", "--total-steps", "900")
        assert done.returncode == 0, done.stderr
        runs.append(without_timings(progress(tmp_path / name)))
    assert runs[0] == runs[1] and len(runs[0]) == 3
    first = runs[0][0]
    assert first["env_steps"] == 300 and first["episodes"] == 12 and first["segments"] == 2
    assert {"adversary/policy_loss", "agent/policy_loss", "adversary/episode_return_mean"} <= set(first)
    assert "policy_loss" not in first  # a diagnostic belongs to a policy
    assert first["agent/episode_return_mean"] != first["adversary/episode_return_mean"]  # opposed rewards


def test_two_policies_train_evaluate_resume_and_export(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    # the run ends at its first finished evaluation (any return reaches the target), whenever that comes
    done = dppo("train", *ADVERSARY, "--address", ray_address, "--run-dir", str(run), "--actors", "1",
                "--total-steps", "150000", "--set", "run.eval_every=1", "--set", "run.eval_episodes=2", "--set",
                "env.normalize_obs=true", "--target-return=-1e9", "--set", "run.target_on=evaluation")
    assert done.returncode == 0, done.stderr
    trained = progress(run)
    assert "adversary/eval_return_mean" in trained[-1] and "agent/eval_return_mean" in trained[-1]
    steps = trained[-1]["env_steps"]
    resumed = dppo("train", "--resume", "--address", ray_address, "--run-dir", str(run), "--total-steps",
                   str(steps + 300), "--set", "run.target_return=null", "--set", "run.target_on=training")
    assert resumed.returncode == 0, resumed.stderr
    assert [r["env_steps"] for r in progress(run)][-3:] == [steps, steps + 150, steps + 300]
    from dppo.run.checkpoint import load

    saved = load(run)
    assert saved["model"] is None and set(saved["policies"]) == {"adversary", "agent"}
    adversary, agent = saved["policies"]["adversary"], saved["policies"]["agent"]
    assert adversary["model"]["policy_head.0.weight"].shape[1] == 8 and agent["model"]["policy_head.0.weight"].shape[
        1] == 10  # each policy its own network for its own observation
    assert len(adversary["obs_stats"]["mean"]) == 8 and adversary["trainer"] is not None
    assert (run / "checkpoints" / "best.pt").is_file()
    evaluated = dppo("eval", "--checkpoint", str(run), "--episodes", "2", "--video", str(tmp_path / "videos"))
    assert evaluated.returncode == 0, evaluated.stderr
    assert "policy adversary: mean return" in evaluated.stdout and "policy agent: mean return" in evaluated.stdout
    videos = sorted((tmp_path / "videos").glob("*.mp4"))  # one per episode of every policy's agents together
    assert len(videos) == 2 and all(v.read_bytes()[4:8] == b"ftyp" and v.stat().st_size > 1000 for v in videos)
    again = dppo("eval", "--checkpoint", str(run), "--episodes", "2")
    assert again.stdout.splitlines()[:3] == evaluated.stdout.splitlines()[:3]  # rendering changes no episode
    exported = dppo("export", "--checkpoint", str(run), "-o", str(tmp_path / "policy.onnx"))
    assert exported.returncode == 0, exported.stderr
    import onnxruntime

    for name, width in (("adversary", 8), ("agent", 10)):
        session = onnxruntime.InferenceSession(str(tmp_path / f"policy.{name}.onnx"))
        (action,) = session.run(None, {"obs": np.zeros((3, width), np.float32)})
        assert action.shape == (3,) and ((action >= 0) & (action < 5)).all()


@pytest.mark.slow
def test_each_policy_trains_with_two_learners(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dppo("train", *ADVERSARY, "--address", ray_address, "--run-dir", str(run), "--actors", "1",
                "--total-steps", "300", "--set", "run.learners=2", "--set", "run.learner_cpus=0.5", "--set",
                "run.actor_cpus=0.5")
    assert done.returncode == 0, done.stderr
    assert [r["env_steps"] for r in progress(run)] == [150, 300]
    resumed = dppo("train", "--resume", "--address", ray_address, "--run-dir", str(run), "--total-steps", "450",
                   "--set", "run.learners=1")  # checkpoints do not depend on the learners
    assert resumed.returncode == 0, resumed.stderr


@pytest.mark.slow
def test_a_run_of_two_policies_survives_a_lost_actor(ray_address: str, tmp_path: Path) -> None:
    """SIGKILL one of two actors mid-run: its replacement joins with every policy's weights; the rounds without it
    train each policy on the other actor's segments, and every counted step was trained on."""
    from runs import run_workers, wait_for_iterations
    from test_faults import start_train

    run = tmp_path / "run"
    proc = start_train([sys.executable, "-m", "dppo"], ray_address, run, *ADVERSARY, "--actors", "2",
                       "--total-steps", "9000", "--set", "env.latency_ms=2")
    try:
        wait_for_iterations(run, 3, proc)
        actors = run_workers(proc.pid, "ray::Actor")
        assert len(actors) == 2, actors
        actors[0].send_signal(signal.SIGKILL)
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["actor_restarts"] == 1 and summary["env_steps"] >= 9000, summary
    records = progress(run)
    assert records[-1]["env_steps"] == sum(r["env_steps_delta"] for r in records) == summary["env_steps"]
    assert any(r["segments"] == 1 for r in records) and all(r["env_steps_delta"] == r["segments"] * 150
                                                           for r in records)


@pytest.mark.slow
def test_a_sweep_of_two_policies_exploits_and_finishes(ray_address: str, tmp_path: Path) -> None:
    """Population-based training over a policy map: its trials continue from checkpoints of two policies (PBT
    pauses and exploits them) and both finish with each policy's curves. Synchronous PBT: the trials meet at
    iterations 2 and 4 however loaded the machine is (asynchronous, they needed 30 iterations to be sure to)."""
    import yaml

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "base": {"env": "mpe2.simple_adversary_v3"}, "trials": 2, "concurrent": 2, "driver_cpus": 0.25,
        "set": {"run.total_steps": 750, "run.actors": 1, "run.actor_cpus": 0.5, "run.tensorboard": False,
                "env.num_envs": 2, "env.kwargs": {"max_cycles": 25}, "ppo.segment_length": 25,
                "ppo.minibatch_size": 50, "policies": {"adversary": ["adversary_*"], "agent": ["agent_*"]}},
        "space": {"ppo.learning_rate": "choice([0.0001, 0.003])"},
        # 5 iterations of 3 agents x 2 envs x 25 steps, a perturbation every 2 (not at the last: each one restarts
        # both trials)
        "scheduler": {"name": "pbt", "perturbation_interval": 2, "quantile": 0.5, "synch": True}}))
    out = tmp_path / "out"
    done = dppo("sweep", "--config", str(sweep), "--out-dir", str(out), "--address", ray_address, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continues from a checkpoint" in done.stderr
    trials = sorted((out / "trials").iterdir())
    assert len(trials) == 2
    logs = "".join((trial / "train.log").read_text() for trial in trials)
    assert any(f"from trial {source.name}'s checkpoint" in logs for source in trials), logs[-3000:]  # an exploit
    for trial in trials:
        last = progress(trial)[-1]
        assert last["env_steps"] == 750 and "adversary/policy_loss" in last and "agent/policy_loss" in last


@pytest.mark.parametrize(("sets", "message"), [
    (["policies={adversary: ['adversary_*']}"], "agent 'agent_0' of env 'mpe2.simple_adversary_v3' is mapped to no "
                                                "policy"),
    (["policies={all: ['*']}"], "policy 'all': agents 'adversary_0'"),
    (["policies={adversary: ['adversary_*'], agent: ['agent_*'], cop: ['cop_*']}"], "policies.cop ['cop_*'] matches "
                                                                                    "no agent"),
    ([], "agents 'adversary_0' (Box(-inf, inf, (8,), float32), Discrete(5)) and 'agent_0'"),
])
def test_a_map_that_does_not_fit_the_env_is_one_line(tmp_path: Path, sets: list[str], message: str) -> None:
    args = ["--env", "mpe2.simple_adversary_v3"]
    done = dppo("train", *args, *[item for s in sets for item in ("--set", s)], "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_resumes_only_with_its_own_map(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dppo("train", *ADVERSARY, "--address", ray_address, "--run-dir", str(run), "--actors", "1",
                "--total-steps", "150")
    assert done.returncode == 0, done.stderr
    config = tmp_path / "other.yaml"
    saved = json.loads(json.dumps(__import__("yaml").safe_load((run / "config.yaml").read_text())))
    saved["policies"] = {"adversary": ["adversary_0"], "agent": ["agent_*"]}
    config.write_text(json.dumps(saved))
    resumed = dppo("train", "--resume", "--config", str(config), "--run-dir", str(run), "--total-steps", "300")
    assert resumed.returncode == 2 and "the checkpoint's policy map" in resumed.stderr, resumed.stderr


@pytest.fixture(autouse=True)
def _pettingzoo() -> None:
    pytest.importorskip("mpe2")
