"""Evaluation while training on a real Ray: evaluations land in progress.jsonl, TensorBoard and summary.json
without holding up a round, the best evaluated weights are kept as best.pt (and `dppo eval --best` plays them to
the same return), the run's end waits for the evaluation in flight and evaluates the final weights (summary.json
holds the evaluation of what was saved), run.target_return can be judged on evaluations, and an evaluation env that
fails stops only the evaluation."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from runs import progress_records

from dppo.distributed.evaluation import EVAL_SEED_OFFSET

# one actor of 16 envs: the preset's 1024-step rounds (2 actors x 8 envs) for an actor's start-up less; evaluation,
# not sampling, is the subject here
CARTPOLE = ["--env", "CartPole-v1", "--seed", "3", "--no-tensorboard", "--actors", "1", "--envs-per-actor", "16"]


def dppo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dppo", *args], capture_output=True, text=True, timeout=timeout)


def evaluated_at_end(stderr: str) -> dict[int, str]:
    """The evaluations that finished after the last iteration, as the run said them: env steps -> return."""
    lines = re.findall(r"^evaluation of the weights at ([\d,]+) env steps: return (\S+) over", stderr, re.MULTILINE)
    return {int(steps.replace(",", "")): mean for steps, mean in lines}


def test_evaluations_are_recorded_and_the_best_is_kept(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dppo("train", *CARTPOLE, "--total-steps", "24576", "--set", "run.eval_every=2", "--set",
                "run.eval_episodes=3", "--set", "run.learners=2", "--address", ray_address, "--run-dir", str(run),
                "--set", "run.tensorboard=true")
    assert done.returncode == 0, done.stderr
    records = progress_records(run)
    evaluated = [r for r in records if "eval_return_mean" in r]
    assert evaluated and all(set(r) >= {"eval_return_std", "eval_episodes", "eval_env_steps"} for r in evaluated)
    for r in evaluated:  # the weights after an even iteration, evaluated while later ones trained
        assert r["eval_episodes"] == 3 and r["eval_env_steps"] % 2048 == 0 and r["eval_env_steps"] < r["env_steps"]
    assert "eval=" in done.stdout
    summary = json.loads((run / "summary.json").read_text())
    at_end = evaluated_at_end(done.stderr)  # the final weights', and the one in flight when the run ended, if any
    assert summary["eval_env_steps"] == summary["env_steps"] == 24576 and 24576 in at_end, done.stderr
    best = summary["eval_return_best"]
    assert best >= max(r["eval_return_mean"] for r in evaluated)
    # best.pt holds the weights and statistics that were evaluated: the same episodes give the same return
    played = dppo("eval", "--checkpoint", str(run), "--best", "--episodes", "3", "--seed", str(3 + EVAL_SEED_OFFSET))
    assert played.returncode == 0 and f"mean return {best:.2f}" in played.stdout, (played.stdout, best)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard")).Reload()
    assert len(events.Scalars("eval/return_mean")) == len(evaluated) + len(at_end)


def test_the_run_s_end_evaluates_what_it_saved(ray_address: str, tmp_path: Path) -> None:
    """Two iterations, an evaluation due after each: the first (of the weights after iteration 1) is in flight when
    the run ends, or just done; it is waited for, and the final weights are evaluated too: summary.json's evaluation
    is the final checkpoint's, which `dppo eval` plays to the same return on the evaluation's seeds."""
    run = tmp_path / "run"
    done = dppo("train", *CARTPOLE, "--total-steps", "2048", "--set", "run.eval_every=1", "--set",
                "run.eval_episodes=3", "--address", ray_address, "--run-dir", str(run))
    assert done.returncode == 0, done.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["iterations"] == 2 and summary["eval_env_steps"] == summary["env_steps"] == 2048, summary
    in_loop = [r["eval_env_steps"] for r in progress_records(run) if "eval_return_mean" in r]
    at_end = evaluated_at_end(done.stderr)
    assert sorted([*in_loop, *at_end]) == [1024, 2048], done.stderr  # none abandoned, none twice
    played = dppo("eval", "--checkpoint", str(run), "--episodes", "3", "--seed", str(3 + EVAL_SEED_OFFSET))
    assert played.returncode == 0 and f"mean return {summary['eval_return_mean']:.2f}" in played.stdout, (
        played.stdout, summary)
    assert f"(eval {at_end[2048]} of the final weights)" in done.stdout.splitlines()[-1]


def test_the_target_can_be_judged_on_evaluations(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dppo("train", *CARTPOLE, "--total-steps", "300000", "--target-return", "60", "--set", "run.eval_every=1",
                "--set", "run.target_on=evaluation", "--address", ray_address, "--run-dir", str(run))
    assert done.returncode == 0, done.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["solved"] and summary["reason"] == "target_return" and summary["eval_return_best"] >= 60
    assert progress_records(run)[-1]["eval_return_mean"] >= 60 and summary["env_steps"] < 300000
    assert summary["eval_env_steps"] == summary["env_steps"]  # eval_return_mean: the final weights', kept or not


def test_an_evaluation_env_that_fails_stops_only_the_evaluation(ray_address: str, tmp_path: Path) -> None:
    # every process's env raises once at its 300th step: the training actor (one, of 16 envs: the 2048-step rounds of
    # the default 2 x 8) recreates its env and goes on (env_retries), the evaluation has no retry and stops, saying so
    # once. The 8 iterations train in under a second on a fast machine, less than an evaluation actor's start: the
    # training actor's env sleeps 10 s at its step 10,241 (iteration 6), after the evaluations began (iteration 1), so
    # the evaluation fails while the run still trains, however fast the machine
    done = dppo("train", "--env", "dppo/Faulty-v0", "--set", "env.kwargs={fail_at: 300, hang_at: 10241, hang_s: 10}",
                "--set", "run.eval_every=1", "--set", "run.eval_episodes=20", "--total-steps", "16384",
                "--no-tensorboard", "--actors", "1", "--envs-per-actor", "16", "--address", ray_address, "--run-dir",
                str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("evaluation stopped: env dppo/Faulty-v0 raised in the evaluation actor") == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["env_steps"] >= 16384 and summary["reason"] == "total_steps"


@pytest.mark.parametrize("args, words", [
    (["train", "--set", "run.target_on=evaluation"], "run.target_on: evaluation judges run.target_return on "
                                                     "evaluation returns, and run.eval_every is 0 (off)"),
    (["train", "--set", "run.eval_mode=best"], "run.eval_mode"),
])
def test_bad_evaluation_settings_are_one_line(args: list[str], words: str, tmp_path: Path) -> None:
    done = dppo(*args, "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_best_without_evaluations_is_one_line(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert dppo("train", *CARTPOLE, "--total-steps", "1024", "--address", ray_address, "--run-dir",
                str(run)).returncode == 0
    for command in ("eval", "export"):
        extra = ["-o", str(tmp_path / "p.onnx")] if command == "export" else []
        done = dppo(command, "--checkpoint", str(run), "--best", *extra)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no best.pt in" in done.stderr, done.stderr
