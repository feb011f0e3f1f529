"""`python -m benchmarks envs`: tiny step counts, real ale-py (and EnvPool where installed); shapes, semantics and the
docs section, never speed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import parse as benchmarks_args
from dppo.bench.docs import section_markers
from dppo.errors import UsageError

# SpaceInvaders: random play scores 5 to 30 points a step, so raw (unclipped) rewards show; 3 lives.
GAME = "ALE/SpaceInvaders-v5"
ENGINES = ["ale", "envpool"] if importlib.util.find_spec("envpool") is not None else ["ale"]
TINY = ["--env", GAME, "--threads", "1", "--envs", "2,3", "--steps", "48", "--warmup", "12", "--repeats", "2",
        "--check-episodes", "1", "--check-steps", "5000", "--engines", ",".join(ENGINES)]


def run_bench(argv: list[str]) -> int:
    args = benchmarks_args(["envs", *argv])
    return args.func(args)


def test_envs_command_measures_each_engine_and_checks_the_same_preprocessing(tmp_path: Path) -> None:
    out, docs = tmp_path / "rows.json", tmp_path / "benchmarks.md"
    assert run_bench([*TINY, "--json", str(out), "--write-docs", str(docs)]) == 0
    rows = json.loads(out.read_text())
    speed = [r for r in rows if r["kind"] == "speed"]
    assert [(r["engine"], r["envs"]) for r in speed] == [(e, n) for n in (2, 3) for e in ENGINES]
    for r in speed:
        rate, cpu_rate = r["steps_per_s"], r["steps_per_cpu_s"]
        assert 0 < rate["min"] <= rate["median"] <= rate["max"] and r["per_thread"] == rate["median"]
        assert 0 < cpu_rate["min"] <= cpu_rate["median"] <= cpu_rate["max"]
    assert [(r["vs_ale"], r["cpu_vs_ale"]) for r in speed if r["engine"] == "ale"] == [(1.0, 1.0)] * 2
    checks = [r for r in rows if r["kind"] == "semantics"]
    assert [r["engine"] for r in checks] == ENGINES
    for r in checks:
        assert r["obs"] == "(4, 84, 84) uint8" and r["episodes"] >= 1 and r["truncations"] == 0
        assert r["max_step_reward"] > 1  # raw game scores: a clipped reward would be 1
        assert r["start_lives"] == 3 and r["life_losses_in_info"] >= 1  # a lost life shows in info["lives"] ...
        assert all(0 < int(lives) <= 3 for lives in r["lives_before_end"].split(","))  # ... and ends no game
    assert checks[0]["same_first_frame"] == 1.0
    text = docs.read_text()
    begin, end = section_markers("envs-SpaceInvaders-v5")
    assert begin in text and end in text and "Machine:" in text and "python -m benchmarks envs" in text
    assert "| engine | envs | episodes |" in text  # the semantics table sits in the section's note
    assert ("x as many env steps per CPU-second as ale" in text) == ("envpool" in ENGINES)  # the verdict


def test_envpool_missing_is_one_line_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool now raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'dppo\[envpool\]'"):
        run_bench([*TINY[:-2], "--engines", "envpool"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--engines", "ale,gym"], "--engines"),
    (["--engines", "ale,ale"], "--engines"),
    (["--env", "CartPole-v1"], "ALE/ id"),
    (["--threads", "0"], "--threads"),
])
def test_bad_options_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        run_bench(argv)
