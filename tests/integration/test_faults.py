"""Fault injection with real processes and real signals: actors, learner, checkpoints, envs, NaNs.

The figures of the learner-kill drill (steps of work lost per kill) are printed; run with -s to see them. The kill
drills run to a budget or a signal, not to a solved env: whether a run still learns as well under kills is a
learning question, answered by `dppo bench chaos` (its final return against a run of the same config without chaos,
docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from runs import progress_records, run_workers, wait_for_iterations, wait_for_records

from dppo.config import load_config
from dppo.run.checkpoint import CheckpointStore, load, newest_intact


def start_train(dppo_cmd: list[str], address: str, run_dir: Path, *args: str) -> subprocess.Popen:
    cmd = [*dppo_cmd, "train", "--address", address, "--run-dir", str(run_dir), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def back_in_a_round(records: list[dict]) -> bool:
    """A round without one of the 2 actors, then a round with both."""
    short = next((i for i, r in enumerate(records) if r["segments"] < 2), None)
    return short is not None and any(r["segments"] == 2 for r in records[short + 1:])


@pytest.mark.slow
def test_run_survives_actor_kills(dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    """SIGKILL a random actor process every few iterations, each once both actors are back in a round (three kills);
    once the last one is back too, SIGTERM ends the run: every kill counted, every actor back before the end.

    The run has no budget it could reach first: the rounds of one actor that go on while a replacement starts could
    spend a budget of 64 iterations before the third kill on a fast machine, so the kills and the run's end are the
    test's events."""
    run_dir = tmp_path / "run"
    proc = start_train(dppo_cmd, ray_address, run_dir, "--seed", "3", "--total-steps", str(10**9),
                       "--set", "run.target_return=null")
    rng = random.Random(0)
    kills = 0
    try:
        for _ in range(3):
            # and both actors in the newest round: a kill lands on a live actor, never on a replacement still
            # starting (rounds of one actor can outpace a replacement's start on a busy machine)
            wait_for_iterations(run_dir, len(progress_records(run_dir)) + rng.randint(3, 8), proc, segments=2)
            workers = run_workers(proc.pid, "ray::Actor")
            assert workers, "no actor process found"
            victim = rng.choice(workers)
            victim.send_signal(signal.SIGKILL)
            kills += 1
        # the last one back: a round without its actor (the round the kill landed in may have had its segment
        # already), then a round of both
        killed_at = len(progress_records(run_dir))
        wait_for_records(run_dir, proc, lambda records: back_in_a_round(records[killed_at:]),
                         "a round without the killed actor, then one with both")
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "signal", summary
    # each kill is a crash on a live node: it spends the crash-loop budget, and its replacement comes back
    assert summary["actor_restarts"] == summary["actor_crashes"] == kills and summary["node_losses"] == 0
    assert err.count(" crashed (") == kills and err.count(" back after ") == kills
    # a killed actor's round goes on with the other actor's segment; every counted step was trained on
    records = progress_records(run_dir)
    assert summary["segments_dropped"] == 0
    assert sum(r["segments"] < 2 for r in records) >= kills
    assert all(r["env_steps_delta"] == r["segments"] * 8 * 64 for r in records)  # CartPole preset: E = 8, T = 64
    assert records[-1]["env_steps"] == sum(r["env_steps_delta"] for r in records) == summary["env_steps"]
    print(f"actor kills: {kills}, restarts counted: {summary['actor_restarts']}, rounds with one actor: "
          f"{sum(r['segments'] < 2 for r in records)}, return at the end {summary['episode_return_mean']}")


@pytest.mark.slow
def test_resume_after_learner_sigkills_loses_only_uncheckpointed_work(
        dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    """SIGKILL the learner at random points (checkpoints every other iteration), resume each time, then resume to the
    budget (48 iterations: each of the three kills comes 2 iterations after its start and up to 2 iterations' time more,
    timed by the run's own iterations: seconds would be 40 iterations on a fast machine and the budget spent)."""
    run_dir = tmp_path / "run"
    args = ["--seed", "2", "--total-steps", str(48 * 2 * 8 * 64), "--set", "run.checkpoint_every=2",
            "--set", "run.target_return=null"]
    rng = random.Random(1)
    lost = []
    for attempt in range(3):
        resume = ["--resume"] if attempt else []
        proc = start_train(dppo_cmd, ray_address, run_dir, *args, *resume)
        wait_for_iterations(run_dir, len(progress_records(run_dir)) + 2, proc)
        newest = progress_records(run_dir)[-2:]
        time.sleep(rng.uniform(0.0, 2.0) * (newest[1]["wall_s"] - newest[0]["wall_s"]))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        steps_done = progress_records(run_dir)[-1]["env_steps"]
        for path in CheckpointStore(run_dir / "checkpoints", 3).list():
            load(path)  # every named checkpoint on disk is whole
        _path, state = newest_intact(run_dir / "checkpoints")
        lost.append(steps_done - state["counters"]["env_steps"])
    proc = start_train(dppo_cmd, ray_address, run_dir, *args, "--resume")
    _out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "total_steps" and summary["env_steps"] >= 48 * 2 * 8 * 64, summary
    records = progress_records(run_dir)
    assert [r["iteration"] for r in records] == list(range(1, len(records) + 1))
    steps = [r["env_steps"] for r in records]
    assert steps == sorted(steps)
    per_iteration = 2 * 8 * load_config().ppo.segment_length
    assert max(lost) <= 2 * per_iteration, lost  # at most the work since the last checkpoint
    print(f"learner kills: {len(lost)}, env steps lost per kill: mean {sum(lost) / len(lost):.0f}, max {max(lost)}")


def test_sigterm_writes_final_checkpoint(dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(dppo_cmd, ray_address, run_dir, "--total-steps", "10000000", "--set",
                       "run.checkpoint_every=1000")
    wait_for_iterations(run_dir, 3, proc)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "signal"
    _path, state = newest_intact(run_dir / "checkpoints")
    assert state["counters"]["iteration"] == summary["iterations"] == progress_records(run_dir)[-1]["iteration"]


def faulty(tmp_path: Path, **kwargs: object) -> list[str]:
    return ["--env", "dppo/Faulty-v0", "--set", f"env.kwargs={json.dumps(kwargs)}", "--set",
            "run.target_return=null", "--set", "run.checkpoint_every=1"]


def test_transient_env_failure_is_recreated(dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    proc = start_train(dppo_cmd, ray_address, tmp_path / "run", *faulty(tmp_path, fail_at=700),
                       "--total-steps", "6000")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    records = progress_records(tmp_path / "run")
    assert all(r["segments"] == 2 for r in records)  # the env copy that raised was recreated: no segment dropped
    assert records[-1]["env_steps"] >= 6000
    assert records[-1]["env_failures"] == 2 and err.count(" raised in actor ") == 1  # once per actor process; warned


def test_persistent_env_failure_stops_with_checkpoint(dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(dppo_cmd, ray_address, run_dir, *faulty(tmp_path, fail_at=3000, persistent=True),
                       "--total-steps", "100000")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "dppo/Faulty-v0" in err and "injected env failure" in err
    # each copy that raised was recreated and its episode cut, the first warned in one line (issue 45); past
    # faults.max_env_failure_share of episodes, one line: the env's error and where it was raised; the traceback in
    # train.log
    *warned, stop = err.splitlines()
    assert len(warned) <= 1 and all(line.startswith("env dppo/Faulty-v0 raised in actor ") for line in warned), err
    assert "Traceback" not in err and "toy.py:" in stop and "faults.max_env_failure_share 0.5" in stop, err
    assert err.endswith(f"; the whole traceback is in {run_dir / 'train.log'}\n"), err
    assert "Traceback" in (run_dir / "train.log").read_text()
    assert json.loads((run_dir / "summary.json").read_text())["reason"] == "error"
    assert newest_intact(run_dir / "checkpoints") is not None


def test_nan_observations_error_names_the_env(dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    proc = start_train(dppo_cmd, ray_address, tmp_path / "run", *faulty(tmp_path, nan_at=1500),
                       "--total-steps", "100000")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "dppo/Faulty-v0" in err and "NaN/Inf" in err and "faults.nonfinite_data=drop" in err


def test_nan_observations_dropped_and_counted(dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    proc = start_train(dppo_cmd, ray_address, tmp_path / "run",
                       *faulty(tmp_path, nan_at=1500, token_file=str(token)),
                       "--set", "faults.nonfinite_data=drop", "--total-steps", "8000")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["segments_dropped"] > 0
    assert any(r["segments"] == 1 for r in progress_records(tmp_path / "run"))


def test_straggler_dropped_after_deadline(dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    proc = start_train(dppo_cmd, ray_address, tmp_path / "run",
                       *faulty(tmp_path, hang_at=1500, hang_s=6, token_file=str(token)),
                       "--set", "faults.sample_timeout_s=2", "--set", "faults.min_actors_fraction=0.5",
                       "--total-steps", "8000")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["segments_dropped"] >= 1
    assert "missed the 2s deadline" in err
    records = progress_records(tmp_path / "run")
    assert any(r["segments"] == 1 for r in records)


def env_steps_served(body: str) -> float:
    """The dppo_env_steps_total sample of a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    return next(sample.value for family in text_string_to_metric_families(body) for sample in family.samples
                if sample.name == "dppo_env_steps_total")


def test_metrics_endpoint_answers_every_scrape_at_50_per_second_while_training(
        dppo_cmd: list[str], ray_address: str, tmp_path: Path) -> None:
    """Requests paced at 50 a second (at least 500, until 3 iterations were written under them; bounded) against the
    learner's metrics port while it trains: every one answered, with the live counter (it moves through the env
    steps of the progress records as they are written). How fast it answers is not asserted: a loaded machine
    answers slower, and speed is for benchmarks."""
    import urllib.request

    from dppo.distributed.ports import free_ports

    (port,) = free_ports(1)
    run_dir = tmp_path / "run"
    proc = start_train(dppo_cmd, ray_address, run_dir, "--metrics-port", str(port), "--set",
                       "metrics.host=127.0.0.1", "--set", "run.target_return=null", "--total-steps", "10000000")
    try:
        wait_for_iterations(run_dir, 3, proc)
        before = len(progress_records(run_dir))
        ok, served, start = 0, [], time.monotonic()
        for i in range(5000):
            if i >= 500 and len(progress_records(run_dir)) - before >= 3:
                break
            time.sleep(max(0.0, start + i / 50 - time.monotonic()))
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                body = resp.read().decode()
            ok += resp.status == 200
            served.append(env_steps_served(body))
        during = progress_records(run_dir)[before:]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert ok == len(served) >= 500
    assert len(during) >= 3, "training kept iterating under the scrape load"
    # live values: the counter only grows, takes only env-step totals of progress records (it is updated with each
    # record), and showed every record written under the load (the last may have come after the last scrape)
    reached = {0} | {r["env_steps"] for r in progress_records(run_dir)}
    assert served == sorted(served) and set(served) <= reached, sorted(set(served) - reached)
    assert len(set(served)) >= len(during) - 1, (sorted(set(served)), [r["env_steps"] for r in during])
