"""`python -m benchmarks learning-checks`: the learning runs moved out of the tests, each against its test's threshold;
here at a budget too small to learn, so one check passes and one fails (exit 1), on the session's Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from runs import progress_records, run_benchmark


@pytest.mark.slow  # two short runs: 29 s on 2 shared cores
def test_learning_checks_run_each_check_and_exit_1_naming_the_one_that_fails(tmp_path: Path,
                                                                              ray_address: str) -> None:
    docs, rows_file, out_dir = tmp_path / "docs" / "benchmarks.md", tmp_path / "rows.json", tmp_path / "runs"
    done = run_benchmark("learning-checks", "--only", "cue-corridor-lstm,cue-corridor-feed-forward", "--total-steps",
                         "1024", "--address", ray_address, "--out-dir", str(out_dir), "--write-docs", str(docs),
                         "--json", str(rows_file), timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "learning checks failed: cue-corridor-lstm"
    lstm, feed_forward = json.loads(rows_file.read_text())
    assert (lstm["check"], feed_forward["check"]) == ("cue-corridor-lstm", "cue-corridor-feed-forward")
    # two iterations: neither policy beats a coin flip, which the LSTM's check fails and the feed-forward's passes
    assert (lstm["threshold"], feed_forward["threshold"]) == (">= 0.9", "<= 0.5")
    assert (lstm["passed"], lstm["result"], feed_forward["passed"], feed_forward["result"]) == (
        False, "FAIL", True, "pass")
    for row in (lstm, feed_forward):
        run = Path(row["run_dir"])
        assert run.parent == out_dir and row["env_steps"] == 1024 and row["wall_s"] > 0
        last = progress_records(run)[-1]
        assert row["measure"] == "last_return" and row["value"] == pytest.approx(last["episode_return_mean"],
                                                                                  abs=1e-4)
        assert f"{row['check']}: last_return " in done.stdout
    recurrent = {row["check"]: yaml.safe_load((Path(row["run_dir"]) / "config.yaml").read_text())["model"]["recurrent"]
                 for row in (lstm, feed_forward)}
    assert recurrent == {"cue-corridor-lstm": "lstm", "cue-corridor-feed-forward": "none"}  # each check's own run
    text = docs.read_text()
    assert "<!-- dppo-bench:learning-checks:begin -->" in text and "## Learning checks" in text
    assert "python -m benchmarks learning-checks --only cue-corridor-lstm,cue-corridor-feed-forward" in text
    assert "| cue-corridor-lstm | last_return |" in text and "| FAIL |" in text and "| pass |" in text


@pytest.mark.parametrize(("args", "words"), [
    (["--only", "blackjack,no-such-check"], "--only: unknown check 'no-such-check'; the checks are"),
    (["--total-steps", "0"], "--total-steps must be >= 1"),
])
def test_learning_checks_refuse_bad_input_in_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    done = run_benchmark("learning-checks", *args, "--write-docs", "benchmarks.md", cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []
