"""`dppo train`: how a run starts over or stops on its own (dppo/commands/train.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from runs import progress_records


def test_auto_resume_without_checkpoint_starts_fresh(tmp_path: Path) -> None:
    """A retried job that died before its first checkpoint must start over, not refuse."""
    from dppo.commands.parser import build_parser
    from dppo.commands.train import prepare

    run = tmp_path / "run"
    run.mkdir()
    (run / "progress.jsonl").write_text('{"iteration": 1}\n')
    args = build_parser().parse_args(["train", "--run-dir", str(run), "--auto-resume"])
    _config, run_dir, state, _source, lock = prepare(args)
    lock.release()
    assert state is None and run_dir == run
    assert not (run / "progress.jsonl").exists()


def test_time_limit_stops_the_run_with_a_checkpoint(tmp_path: Path, ray_address: str) -> None:
    """`--time-limit S`: a wall-clock budget (actor counts compared at equal time); the run ends with a checkpoint."""
    import json
    import sys

    from dppo.run.checkpoint import newest_intact

    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", str(run),
                           "--actors", "1", "--total-steps", "1e8", "--time-limit", "3", "--no-tensorboard"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run / "summary.json").read_text())
    # It stops at the end of the first iteration that reaches the limit, not later (the clock of progress.jsonl).
    clock = [r["wall_s"] for r in progress_records(run)]
    assert summary["reason"] == "time_limit" and all(s < 3 for s in clock[:-1]) and 3 <= clock[-1] <= summary["wall_s"]
    assert 0 < summary["env_steps"] < 100_000_000
    checkpoints = sorted((run / "checkpoints").glob("ckpt-*.pt"))
    assert checkpoints
    # The limit counts the whole run, resumes included: resumed with the limit spent, the run says so in one
    # line and ends at once (exit 0, summary reason time_limit), training nothing and starting no Ray.
    trained_s = newest_intact(run / "checkpoints")[1]["counters"]["wall_s"]
    resumed = subprocess.run([sys.executable, "-m", "dppo", "train", "--run-dir", str(run), "--resume",
                              "--time-limit", "2", "--address", "127.0.0.1:1", "--no-tensorboard"],  # no Ray there
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr == (f"the time limit of 2 s is spent: the run trained {trained_s:,.1f} s before this "
                              "resume (the limit counts the whole run); raise --time-limit to go on\n")
    again = json.loads((run / "summary.json").read_text())
    assert again["reason"] == "time_limit" and again["env_steps"] == summary["env_steps"]
    assert sorted((run / "checkpoints").glob("ckpt-*.pt")) == checkpoints
    assert resumed.stdout.startswith("stopped (time_limit): return ")


def test_a_progress_line_lost_after_its_checkpoint_comes_back_on_resume(tmp_path: Path, ray_address: str) -> None:
    """A learner killed between writing iteration N's checkpoint and appending N's progress line: the resumed
    run gets the line back from the checkpoint, so progress.jsonl has every iteration once, in order."""
    import json
    import sys

    run = tmp_path / "run"
    base = [sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", str(run),
            "--actors", "1", "--envs-per-actor", "16",  # the preset's 1024-step rounds (2 x 8 envs), one start-up
            "--set", "run.checkpoint_every=1", "--no-tensorboard"]
    first = subprocess.run([*base, "--total-steps", "2048"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    lines = (run / "progress.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [1, 2]
    (run / "progress.jsonl").write_text(lines[0] + "\n")  # the kill: checkpoint 2 on disk, progress line 2 not
    resumed = subprocess.run([*base, "--resume", "--total-steps", "3072"], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    records = progress_records(run)
    assert [r["iteration"] for r in records] == [1, 2, 3]
    assert records[1]["env_steps"] == json.loads(lines[1])["env_steps"]
    assert records[1]["checkpoint_s"] is None  # the one value the checkpoint cannot know
